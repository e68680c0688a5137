"""mmsp against transformers itself, for every family: tiny random models that
transformers builds and writes (save_pretrained, sharded, float64), one step of two
packed sequences with images, and mmsp's first-step loss and every gradient (written by
`mmsp train --save-gradients`, read back by transformers) against transformers' own
forward and backward, on 1 rank and on 4 (ring 2 × ulysses 2). Then the files: mmsp
reads every naming layout the family has had, and transformers reads what mmsp writes.

Tolerances come from what transformers keeps in float32 inside a float64 model: the
rotary tables (inv_freq and cos/sin are computed in float32), RMSNorm's variance, the
attention softmax, and Qwen3.5's Gated DeltaNet (its chunked rule runs in float32).
mmsp computes all of it in float64. Measured 2026-11-27 (transformers 5.17.0): loss
within 7.1e-10 relative, gradients within 3.6e-7 (per tensor, norm-wise) — Qwen3.5's
Gated DeltaNet parameters within 3.2e-5. A wrong mask, position, shard border or weight
moves the loss by 1e-3 or more and a gradient by O(1).
"""
import json
import os
import shutil
import subprocess

import pytest
import torch
from safetensors.torch import load_file, save_file

import families as F

LOSS_RTOL = 5e-9
MOE = ("qwen3_vl_moe", "qwen3_5_moe")
GRAD_RTOL = {"qwen3_5": 1e-4, "qwen3_5_moe": 1e-4}  # Gated DeltaNet in float32 inside transformers
GRAD_RTOL_DEFAULT = 2e-6
LR = 1e-3


def _load_reference(path):
    from transformers import AutoModelForImageTextToText

    # A mixture of experts' default grouped-mm experts refuse float64 (families.build_model).
    with open(os.path.join(path, "config.json")) as f:
        moe = {"num_experts", "num_local_experts"} & set(json.load(f).get("text_config", {}))
    extra = {"experts_implementation": "eager"} if moe else {}
    return AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float64, output_loading_info=True, **extra)


class Case:
    """One family: transformers' model on disk, the data, and transformers' loss and
    gradients for it."""

    def __init__(self, name, root):
        self.name, self.root = name, root
        self.family = F.FAMILIES[name]
        self.model = F.build_model(self.family)
        self.model_dir = os.path.join(root, "model")
        F.save_model(self.model, self.model_dir)
        self.samples = F.make_samples(self.family)
        self.data = F.write_jsonl(self.samples, os.path.join(root, "data"))
        self.model.zero_grad()
        self.logits = []  # transformers' logits of each sample, for the log-prob checks
        self.loss = F.reference_loss(self.model, self.family, self.samples, logits_out=self.logits)
        self.loss.backward()
        self.tokens = sum(len(s.input_ids) for s in self.samples)

    def train(self, mmsp_bin, mmsp_run, ranks, tag, model_dir=None, extra=(), data=None):
        """`mmsp train` for one step (of `data`, by default the case's); returns (loss, the
        gradient dir, the run dir)."""
        out, grads = os.path.join(self.root, f"out-{tag}"), os.path.join(self.root, f"grads-{tag}")
        # The step holds exactly the two samples: the budget is their length, rounded up.
        per_rank = -(-self.tokens // ranks)
        cmd = [mmsp_bin, "train", "--model", model_dir or self.model_dir, "--data", data or self.data, "--steps", "1",
               "--dtype", "float64", "--no-shuffle", "--tokens-per-rank", str(per_rank), "--lr", str(LR),
               "--save-gradients", grads, "--out", out, "--quiet", *extra]
        if ranks > 1:
            cmd = [mmsp_run, "-n", str(ranks), "--", *cmd, "--ring", "2", "--ulysses", str(ranks // 2)]
            if self.name in MOE:  # the experts split over every rank: ring × Ulysses folded into one expert group
                cmd += ["--expert", str(ranks)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"{' '.join(cmd)}\nexit {r.returncode}\n{r.stdout}\n{r.stderr}"
        with open(os.path.join(out, "metrics.jsonl")) as f:
            loss = json.loads(f.readline())["loss"]
        return loss, grads, out


@pytest.fixture(scope="module", params=list(F.FAMILIES))
def case(request, tmp_path_factory):
    return Case(request.param, str(tmp_path_factory.mktemp(request.param)))


def _gradient_tensors(grads_dir):
    """Every tensor of a --save-gradients directory, by name."""
    out = {}
    for name in sorted(os.listdir(grads_dir)):
        if name.endswith(".safetensors"):
            out.update(load_file(os.path.join(grads_dir, name)))
    return out


def _check_gradients(case, grads_dir, model=None, rtol=None):
    """Every parameter's gradient, as transformers reads mmsp's gradient directory,
    against transformers' own .grad (norm-wise per tensor; a gradient that is zero in
    exact arithmetic, such as a key bias's, is measured against the whole gradient), of
    the case's model or `model`, within `rtol` (default: the family's)."""
    got, info = _load_reference(grads_dir)
    assert not any(info.values()), f"transformers read {grads_dir} with {info}"
    got = dict(got.named_parameters())
    model = model or case.model
    ref = {n: (p.grad if p.grad is not None else torch.zeros_like(p)) for n, p in model.named_parameters()}
    assert set(got) == set(ref)
    scale = torch.sqrt(sum(g.norm() ** 2 for g in ref.values()))
    rtol = rtol or GRAD_RTOL.get(case.name, GRAD_RTOL_DEFAULT)
    errors = {n: ((got[n] - g).norm() / max(g.norm(), 1e-6 * scale)).item() for n, g in ref.items()}
    worst = max(errors, key=errors.get)
    print(f"{case.name}: {len(errors)} gradients, worst {worst} at {errors[worst]:.3g} (tolerance {rtol:g})")
    bad = {n: e for n, e in errors.items() if e > rtol}
    assert not bad, f"{len(bad)} gradients differ beyond {rtol:g}: {dict(list(bad.items())[:5])}"


@pytest.mark.parametrize("ranks", [1, 4])
def test_loss_and_every_gradient_equal_transformers(case, mmsp_bin, mmsp_run, ranks):
    loss, grads, _ = case.train(mmsp_bin, mmsp_run, ranks, f"r{ranks}")
    ref = case.loss.item()
    print(f"{case.name} on {ranks} rank(s): loss {loss!r} vs transformers {ref!r}, rel {abs(loss - ref) / ref:.3g}")
    assert abs(loss - ref) <= LOSS_RTOL * ref
    _check_gradients(case, grads)


def test_transformers_reads_what_mmsp_writes(case, mmsp_bin, mmsp_run):
    """The step-1 checkpoint's hf/ loads into transformers' class with no missing,
    unexpected or mismatched tensor, and every weight is transformers' initial one moved
    by AdamW's first step (at most lr, with no weight decay): a weight read into the wrong parameter would be
    off by its own size."""
    _, _, out = case.train(mmsp_bin, mmsp_run, 1, "written", extra=("--weight-decay", "0"))
    loaded, info = _load_reference(os.path.join(out, "step-000001", "hf"))
    assert not any(info.values()), info
    before = dict(case.model.named_parameters())
    for name, p in loaded.named_parameters():
        moved = (p - before[name]).abs().max().item()
        assert moved <= LR * (1 + 1e-6), f"{name} moved by {moved}, more than lr {LR}"
        assert p.dtype == torch.float64


# The naming layouts each family's files have had, as renamings of what transformers
# 5.17 writes (the first pair that matches a name applies).
LAYOUTS = {
    "qwen2_vl": {"transformers >= 4.52 (model.language_model., model.visual.)":
                 [("model.", "model.language_model."), ("visual.", "model.visual.")]},
    "qwen2_5_vl": {"transformers >= 4.52 (model.language_model., model.visual.)":
                   [("model.", "model.language_model."), ("visual.", "model.visual.")]},
    "llava": {"llava-1.5-*-hf (vision_tower.vision_model.)": [("vision_tower.", "vision_tower.vision_model.")],
              "transformers 4.52 to 4.57 (model.*, vision_model.)":
              [("language_model.model.", "model.language_model."), ("language_model.lm_head.", "lm_head."),
               ("vision_tower.", "model.vision_tower.vision_model."),
               ("multi_modal_projector.", "model.multi_modal_projector.")]},
    # transformers 5.17 writes Qwen3-VL-MoE's fused experts as [E, 2I, hidden] and [E, hidden, I];
    # the released files (transformers 4.57) hold them transposed, [E, hidden, 2I] and [E, I, hidden].
    "qwen3_vl_moe": {"released (fused experts [E, hidden, 2I], [E, I, hidden])": []},
    "internvl": {"transformers >= 4.52 (model.*)":
                 [("language_model.model.", "model.language_model."), ("language_model.lm_head.", "lm_head."),
                  ("vision_tower.", "model.vision_tower."),
                  ("multi_modal_projector.", "model.multi_modal_projector.")]},
}


# Layouts whose expert tensors are the files' with their last two dimensions swapped.
TRANSPOSED = {"qwen3_vl_moe": (".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")}


def _rename(src, dst, pairs, transposed=()):
    os.makedirs(dst)
    shutil.copy(os.path.join(src, "config.json"), dst)
    with open(os.path.join(src, "model.safetensors.index.json")) as f:
        index = json.load(f)
    renamed = {}
    for file in sorted(set(index["weight_map"].values())):
        tensors = {}
        for name, t in load_file(os.path.join(src, file)).items():
            new = next((to + name[len(fr):] for fr, to in pairs if name.startswith(fr)), name)
            tensors[new] = t.transpose(1, 2).contiguous() if name.endswith(transposed) else t
            renamed[new] = file
        save_file(tensors, os.path.join(dst, file), metadata={"format": "pt"})
    index["weight_map"] = dict(sorted(renamed.items()))
    with open(os.path.join(dst, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)


def test_every_naming_layout_reads_the_same(case, mmsp_bin, mmsp_run):
    """Each layout is one transformers reads (no missing or unexpected key, the same
    weights, bitwise), and mmsp's loss from it is the loss from transformers' own files to
    round-off. (Not bitwise: two runs of the same step were seen 5e-15 apart once, under a
    loaded ctest on a clean clone; the cause is not pinned down. A weight read into the
    wrong tensor moves the loss by 1e-3 or more.)"""
    layouts = LAYOUTS.get(case.name)
    if not layouts:
        pytest.skip(f"{case.name} has had one naming layout (the one transformers writes)")
    base, _, _ = case.train(mmsp_bin, mmsp_run, 1, "layout-base")
    for i, (what, pairs) in enumerate(layouts.items()):
        dst = os.path.join(case.root, f"layout-{i}")
        _rename(case.model_dir, dst, pairs, TRANSPOSED.get(case.name, ()))
        loaded, info = _load_reference(dst)
        assert not any(info.values()), f"{what}: transformers reads it with {info}"
        ref = dict(case.model.named_parameters())
        for name, p in loaded.named_parameters():
            assert torch.equal(p, ref[name]), f"{what}: {name} differs"
        loss, _, _ = case.train(mmsp_bin, mmsp_run, 1, f"layout-{i}", model_dir=dst)
        assert abs(loss - base) <= 1e-12 * abs(base), f"{what}: loss {loss!r} != {base!r}"


# --- mmsp logprobs --------------------------------------------------------------------------
# Per-token log-probs (and entropy) of a .jsonl under the same checkpoints: every family on 1
# rank and on 4 (ring 2 × Ulysses 2), against transformers' log_softmax(logits / T) gathered at
# the labels. Folded into this module so that each family's model and checkpoint are built
# once for the loss, gradient and log-prob checks together. The file: the case's two samples
# with images, an RL-style text row (prompt unlabelled, response labelled) and a row with no
# labelled token (an empty line of values). 1 rank reads it in steps of one row's budget (three
# steps), 4 ranks in one step: the values must not depend on how the file was packed.
TEMPERATURE = 0.7
# Tolerance: transformers keeps the rotary tables, RMSNorm's variance and the attention
# softmax (and Qwen3.5's Gated DeltaNet) in float32 inside a float64 model (the module's
# docstring); mmsp computes them in float64. Per token that is measured 2026-12-02 at 3.6e-8
# (LLaVA, InternVL) to 6.2e-8 (Qwen3.5) absolute, the same on 1 and 4 ranks, where the loss,
# a mean over tokens, agrees to 5e-9: per-token values cannot meet 1e-9 against this
# reference (a text-only row is 2.4e-8 off too). A wrong label, position, mask or shard
# border moves a log-prob by 1e-3 or more. Between mmsp's own meshes: 1e-12 (below).
LOGPROB_ATOL = 2e-7


def _logprob_samples(case):
    gen = torch.Generator().manual_seed(7)
    words = lambda n: torch.randint(*F.TEXT_RANGE, (n,), generator=gen).tolist()
    prompt, response = [1] + words(12), words(8) + [2]
    rl_row = F.Sample(prompt + response, [0] * len(prompt) + [1] * len(response), [])
    unlabelled = F.Sample([1] + words(6), [0] * 7, [])
    return case.samples + [rl_row, unlabelled]


def _run_logprobs(case, mmsp_bin, mmsp_run, tag, ranks, mesh=(), extra=()):
    """`mmsp logprobs` at TEMPERATURE with --entropy; its lines, cached per tag."""
    cache = case.__dict__.setdefault("logprob_runs", {})
    if tag in cache:
        return cache[tag]
    if "logprob_data" not in case.__dict__:
        case.logprob_samples = _logprob_samples(case)
        case.logprob_data = F.write_jsonl(case.logprob_samples, os.path.join(case.root, "data-logprobs"))
    lengths = [len(s.input_ids) for s in case.logprob_samples]
    per_rank = max(lengths) if ranks == 1 else -(-sum(lengths) // ranks)
    out = os.path.join(case.root, f"logprobs-{tag}.jsonl")
    cmd = [mmsp_bin, "logprobs", "--model", case.model_dir, "--data", case.logprob_data, "--out", out,
           "--dtype", "float64", "--tokens-per-rank", str(per_rank), "--temperature", str(TEMPERATURE),
           "--entropy", *extra]
    if ranks > 1:
        cmd = [mmsp_run, "-n", str(ranks), "--", *cmd, *mesh]
        if case.name in MOE:
            cmd += ["--expert", str(ranks)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{' '.join(cmd)}\nexit {r.returncode}\n{r.stdout}\n{r.stderr}"
    with open(out) as f:
        cache[tag] = [json.loads(line) for line in f]
    return cache[tag]


def _reference_logprobs(case):
    """transformers' log_softmax(logits / T) at each labelled token, and the entropy, per
    sample (computed once per family)."""
    if "logprob_reference" in case.__dict__:
        return case.logprob_reference
    ref = case.logprob_reference = []
    with torch.no_grad():
        for i, s in enumerate(case.logprob_samples):
            # the case's own samples: the logits its loss was computed from; the text rows: a forward
            logits = case.logits[i] if i < len(case.logits) else F.sequence_logits(case.model, case.family, s)
            logp = torch.log_softmax(logits / TEMPERATURE, -1)[:-1]
            keep = torch.tensor(s.loss_mask[1:], dtype=torch.bool)
            at = logp.gather(1, torch.tensor(s.input_ids[1:]).unsqueeze(1)).squeeze(1)
            entropy = -(logp.exp() * logp).sum(-1)
            ref.append((at[keep], entropy[keep]))
    return ref


@pytest.mark.parametrize("ranks", [1, 4])
def test_logprobs_equal_transformers(case, mmsp_bin, mmsp_run, ranks):
    mesh = ("--ring", "2", "--ulysses", "2") if ranks == 4 else ()
    lines = _run_logprobs(case, mmsp_bin, mmsp_run, f"r{ranks}", ranks, mesh)
    assert [line["index"] for line in lines] == list(range(len(case.logprob_samples)))
    atol = LOGPROB_ATOL
    worst = 0.0
    for line, (lp, ent) in zip(lines, _reference_logprobs(case)):
        got_lp = torch.tensor(line["logprobs"], dtype=torch.float64)
        got_ent = torch.tensor(line["entropy"], dtype=torch.float64)
        assert got_lp.shape == lp.shape and got_ent.shape == ent.shape, f"sample {line['index']}"
        if lp.numel():
            worst = max(worst, (got_lp - lp).abs().max().item(), (got_ent - ent).abs().max().item())
    print(f"{case.name} on {ranks} rank(s): log-probs and entropy within {worst:.3g} of transformers")
    assert worst <= atol, f"{case.name}: {worst:.3g} > {atol:g}"


# Two more meshes for one family, the most distinct (Qwen3.5: images, and a hybrid decoder
# whose Gated DeltaNet layers carry state across the ring; one family for the CI budget):
# ring 2 alone, and Ulysses 2 alone with the weights and LM head row-sharded (--shard
# parameters: the head read in rounds of rows from both ranks). With the 4-rank run above
# (ring 2 × Ulysses 2), every value = 1 rank's, 1e-12 (fp64).
@pytest.mark.parametrize("tag, mesh", [("ring2", ("--ring", "2")),
                                       ("ulysses2-shard", ("--ulysses", "2", "--shard", "parameters"))])
def test_logprobs_equal_one_rank_on_every_mesh(case, mmsp_bin, mmsp_run, tag, mesh):
    if case.name != "qwen3_5":
        pytest.skip("one family carries the extra meshes (the 4-rank run of every family is above)")
    one = _run_logprobs(case, mmsp_bin, mmsp_run, "r1", 1)
    for other in (_run_logprobs(case, mmsp_bin, mmsp_run, tag, 2, mesh),
                  _run_logprobs(case, mmsp_bin, mmsp_run, "r4", 4, ("--ring", "2", "--ulysses", "2"))):
        assert [line["index"] for line in other] == [line["index"] for line in one]
        for a, b in zip(one, other):
            for key in ("logprobs", "entropy"):
                assert len(a[key]) == len(b[key])
                diff = max((abs(x - y) for x, y in zip(a[key], b[key])), default=0.0)
                assert diff <= 1e-12, f"{tag}: sample {a['index']} {key} differs by {diff:.3g}"


def test_logprobs_refuses_bad_input_on_every_rank(case, mmsp_bin, mmsp_run, tmp_path):
    """A bad temperature (0, inf), an --out that is a directory and a data line a train run
    refuses (a token id beyond the vocabulary): exit 2 with the value and the rule, said by
    every rank, and no --out written. (One family: the checks do not depend on it.)"""
    if case.name != "qwen2_vl":
        pytest.skip("the checks are the same for every family")
    bad_data = tmp_path / "bad.jsonl"
    bad_data.write_text(json.dumps({"input_ids": [1, 5, 9999]}) + "\n")
    out = str(tmp_path / "lp.jsonl")
    # (flags, message, ranks): the checks before the rendezvous are one code path, so one of
    # them runs on 2 ranks; the data's (after it, in the run's checks) too.
    cases = [(("--temperature", "0"), "--temperature 0 must be a finite number > 0", 2),
             (("--temperature", "inf"), "--temperature inf must be a finite number > 0", 1),
             (("--out", str(tmp_path)), f"--out {tmp_path} is a directory", 1),
             (("--data", str(bad_data)), "9999", 2)]
    for flags, message, ranks in cases:
        args = {"--model": case.model_dir, "--data": case.data, "--out": out}
        args.update(dict(zip(flags[::2], flags[1::2])))
        cmd = [mmsp_bin, "logprobs", *[x for kv in args.items() for x in kv]]
        if ranks > 1:
            cmd = [mmsp_run, "-n", str(ranks), "--", *cmd, "--ring", str(ranks)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        said = r.stdout + r.stderr
        assert r.returncode == 2, f"{flags}: exit {r.returncode}\n{said}"
        assert said.count(message) >= ranks, f"{flags}: not said by every rank: {message!r}\n{said}"
        assert not os.path.exists(out), f"{flags}: {out} was written"


# --- mmsp train --objective grpo (issue 72) against transformers and mmsp.rl ------------------

def _objective_family(case):
    """mmsp.rl from the source tree (its losses need no build), for the two families that
    carry the objectives' comparisons (CI's minutes: Qwen2-VL and the Qwen3.5 hybrid; every
    family's mesh exactness is in test_train_sp's Finetune.PolicyObjectives*)."""
    if case.name not in ("qwen2_vl", "qwen3_5"):
        pytest.skip("two families carry the objective's comparison (CI's minutes)")
    import importlib
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "python"))
    return importlib.import_module("mmsp.rl")


def _label_logprobs(logits, s, temperature):
    """transformers' log_softmax(logits / T) at each labelled token of sample `s`."""
    keep = torch.tensor(s.loss_mask[1:], dtype=torch.bool)
    lp = torch.log_softmax(logits / temperature, -1)[:-1]
    return lp.gather(1, torch.tensor(s.input_ids[1:]).unsqueeze(1)).squeeze(1)[keep]


def _label_entropies(logits, s, temperature):
    """The entropy of softmax(logits / T) at each labelled token of sample `s`."""
    keep = torch.tensor(s.loss_mask[1:], dtype=torch.bool)
    lp = torch.log_softmax(logits / temperature, -1)[:-1]
    return -(lp.exp() * lp).sum(-1)[keep]


def _rollout_data(case, lps):
    """The case's samples as a rollouts file: old log-probabilities moved from the model's
    own by up to ±0.35 (some ratios clip), reference ones beside them, one advantage for
    the first sequence and one per token for the second."""
    rollouts = []
    with open(case.data) as f:
        lines = [json.loads(text) for text in f]
    for i, (line, lp) in enumerate(zip(lines, lps)):
        k = torch.arange(lp.numel(), dtype=torch.float64)
        old = lp + 0.35 * torch.sin(1.7 * (i + 3 * k))
        ref = torch.clamp(lp - 0.25 * torch.cos(0.9 * (2 * i + k)), max=0.0)
        adv = 0.8 if i == 0 else torch.sin(0.7 * (5 * i + k))
        line.update(old_logprobs=old.tolist(), ref_logprobs=ref.tolist(),
                    advantages=adv if isinstance(adv, float) else adv.tolist())
        rollouts.append((old, ref, adv))
    path = os.path.join(os.path.dirname(case.data), "rollouts.jsonl")
    with open(path, "w") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
    return path, rollouts


# GRPO (seq-mean-token-mean, k3 KL 0.1, entropy bonus 0.01, temperature 0.7) on 4 ranks
# (ring 2 × Ulysses 2):
# the loss and every gradient = mmsp.rl.policy_loss (the Python objective the suite checks
# against TRL's GRPO loss, tests/python/test_rl.py) on transformers' own forward
# (_objective_family: Qwen2-VL and Qwen3.5).
@pytest.mark.parametrize("ranks", [4])
def test_policy_objective_equals_transformers(case, mmsp_bin, mmsp_run, ranks):
    policy_loss = _objective_family(case).policy_losses.policy_loss
    label_logprobs = lambda logits, s: _label_logprobs(logits, s, TEMPERATURE)  # noqa: E731
    data, rollouts = _rollout_data(case, [label_logprobs(lg, s) for lg, s in zip(case.logits, case.samples)])
    case.model.zero_grad()
    logits = [F.sequence_output(case.model, case.family, s).logits[0] for s in case.samples]
    lps = [label_logprobs(lg, s) for lg, s in zip(logits, case.samples)]
    entropies = [_label_entropies(lg, s, TEMPERATURE) for lg, s in zip(logits, case.samples)]
    width = max(lp.numel() for lp in lps)
    pad = lambda t: torch.nn.functional.pad(t, (0, width - t.numel()))
    mask = torch.stack([pad(torch.ones(lp.numel())) for lp in lps]).bool()
    adv = torch.stack([pad(torch.full((lp.numel(),), a) if isinstance(a, float) else a)
                       for lp, (_, _, a) in zip(lps, rollouts)])
    ref_loss = policy_loss(torch.stack([pad(lp) for lp in lps]), torch.stack([pad(o) for o, _, _ in rollouts]), adv,
                           mask, agg="seq-mean-token-mean", ref_logprobs=torch.stack([pad(r) for _, r, _ in rollouts]),
                           kl_coef=0.1, kl_type="k3", entropy=torch.stack([pad(e) for e in entropies]),
                           entropy_coef=0.01).loss
    ref_loss.backward()
    extra = ("--objective", "grpo", "--kl-coef", "0.1", "--entropy-coef", "0.01", "--temperature", str(TEMPERATURE))
    loss, grads, _ = case.train(mmsp_bin, mmsp_run, ranks, f"grpo-r{ranks}", data=data, extra=extra)
    ref = ref_loss.item()
    print(f"{case.name} GRPO on {ranks} ranks: loss {loss!r} vs mmsp.rl on transformers {ref!r}")
    # The surrogate weighs each token's gradient by a signed coefficient: the sum cancels,
    # so transformers' float32 internals (3.6e-8 per log-prob, LOGPROB_ATOL's comment)
    # show more here than in the cross-entropy's mean: measured 2.0e-8 on the loss, and on
    # Qwen3.5's Gated DeltaNet decay parameters (A_log, dt_bias) 7.9e-4 (1.5e-7 elsewhere; 2026-12-02, with the entropy bonus).
    assert abs(loss - ref) <= 1e-7 * max(abs(ref), 1e-2)
    _check_gradients(case, grads, rtol=2e-3 if case.name == "qwen3_5" else None)
    if case.name == "qwen3_5":  # there mmsp itself is the float64 reference: 4 ranks = 1 rank
        one_loss, one, _ = case.train(mmsp_bin, mmsp_run, 1, "grpo-r1", data=data, extra=extra)
        assert abs(one_loss - loss) <= 1e-12 * abs(one_loss)
        a, b = _gradient_tensors(one), _gradient_tensors(grads)
        assert a.keys() == b.keys()
        worst = max(((a[n] - b[n]).norm() / max(a[n].norm(), 1e-30)).item() for n in a)
        print(f"qwen3_5 GRPO: 4 ranks' gradients within {worst:.3g} of 1 rank's")
        assert worst <= 1e-9


# DPO (beta 0.2) on 4 ranks, the case's two sequences as one pair: the loss and every
# gradient = mmsp.rl.dpo_loss (the suite checks it against TRL's DPOTrainer) on
# transformers' forward; the reference sums are the model's own moved by ±0.7.
@pytest.mark.parametrize("ranks", [4])
def test_dpo_objective_equals_transformers(case, mmsp_bin, mmsp_run, ranks):
    dpo_loss = _objective_family(case).dpo.dpo_loss
    logps = lambda logits, s: _label_logprobs(logits, s, 1.0).sum()  # noqa: E731

    refs = [logps(lg, s).item() + shift for lg, s, shift in zip(case.logits, case.samples, (0.7, -0.7))]
    with open(case.data) as f:
        chosen, rejected = (json.loads(text) for text in f)
    data = os.path.join(os.path.dirname(case.data), "pairs.jsonl")
    with open(data, "w") as f:
        f.write(json.dumps({"chosen": chosen, "rejected": rejected, "ref_chosen_logps": refs[0],
                            "ref_rejected_logps": refs[1]}) + "\n")
    case.model.zero_grad()
    c, r = (logps(F.sequence_output(case.model, case.family, s).logits[0], s) for s in case.samples)
    ref_loss = dpo_loss(c.reshape(1), r.reshape(1), torch.tensor([refs[0]], dtype=torch.float64),
                        torch.tensor([refs[1]], dtype=torch.float64), beta=0.2)
    ref_loss.backward()
    loss, grads, _ = case.train(mmsp_bin, mmsp_run, ranks, f"dpo-r{ranks}", data=data,
                                extra=("--objective", "dpo", "--beta", "0.2"))
    print(f"{case.name} DPO on {ranks} ranks: loss {loss!r} vs mmsp.rl on transformers {ref_loss.item()!r}")
    # A side's sum adds its tokens' float32-internals error (3.6e-8 each): 1.6e-8 measured.
    assert abs(loss - ref_loss.item()) <= 1e-7 * abs(ref_loss.item())
    _check_gradients(case, grads, rtol=2e-3 if case.name == "qwen3_5" else None)
