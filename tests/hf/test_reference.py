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
        self.loss = F.reference_loss(self.model, self.family, self.samples)
        self.loss.backward()
        self.tokens = sum(len(s.input_ids) for s in self.samples)

    def train(self, mmsp_bin, mmsp_run, ranks, tag, model_dir=None, extra=()):
        """`mmsp train` for one step; returns (loss, the gradient dir, the run dir)."""
        out, grads = os.path.join(self.root, f"out-{tag}"), os.path.join(self.root, f"grads-{tag}")
        # The step holds exactly the two samples: the budget is their length, rounded up.
        per_rank = -(-self.tokens // ranks)
        cmd = [mmsp_bin, "train", "--model", model_dir or self.model_dir, "--data", self.data, "--steps", "1",
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


def _check_gradients(case, grads_dir):
    """Every parameter's gradient, as transformers reads mmsp's gradient directory,
    against transformers' own .grad (norm-wise per tensor; a gradient that is zero in
    exact arithmetic, such as a key bias's, is measured against the whole gradient)."""
    got, info = _load_reference(grads_dir)
    assert not any(info.values()), f"transformers read {grads_dir} with {info}"
    got = dict(got.named_parameters())
    ref = {n: (p.grad if p.grad is not None else torch.zeros_like(p)) for n, p in case.model.named_parameters()}
    assert set(got) == set(ref)
    scale = torch.sqrt(sum(g.norm() ** 2 for g in ref.values()))
    rtol = GRAD_RTOL.get(case.name, GRAD_RTOL_DEFAULT)
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
