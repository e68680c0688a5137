"""What each rank runs in test_rl.py: per-token log-probs and entropy from a patched model
(mmsp.patch, return_token_logprobs) and the RL losses written on them (mmsp.rl), against the
unpatched transformers model on one process: transformers' own logits, log_softmax gathered at
the labels, each sequence run alone; the same loss functions on those values; the loss and
every parameter's gradient (fp64). The helpers of sp_checks.py (the collator's batch, the
gradient comparison) are reused."""
import copy
import os
import sys
from types import SimpleNamespace

import torch

import sp_checks

TEMPERATURE = 0.8


def _families():
    sys.path.insert(0, os.path.join(sp_checks.ROOT, "tests", "hf"))
    from transformers.utils import logging

    import families

    logging.set_verbosity_error()
    return families


def rl_samples(family):
    """Four sequences: two with images (across shard borders on 4 ranks), two text-only (a
    rank, or a dp row, with no image)."""
    return _families().make_samples(family) + [sp_checks.text_sample(5, 9), sp_checks.text_sample(6, 14)]


def left_pad(batch, rows):
    """The collator's batch with `rows` padded on the left (TRL's and verl's prompts)."""
    out = {k: v.clone() for k, v in batch.items()}
    for b in rows:
        n = int(out["attention_mask"][b].sum())
        for key in ("input_ids", "attention_mask", "labels"):
            out[key][b] = torch.roll(out[key][b], out[key].shape[1] - n)
    return out


def reference_values(model, family, samples, attention_mask, temperature):
    """transformers' log_softmax(logits / temperature) gathered at each labelled token, and the
    entropy there, at the batch's columns: [B, T] each, differentiable."""
    families = _families()
    B, T = attention_mask.shape
    lp = torch.zeros(B, T, dtype=torch.float64)
    ent = torch.zeros(B, T, dtype=torch.float64)
    for b, s in enumerate(samples):
        log_p = (families.sequence_logits(model, family, s) / temperature).log_softmax(-1)[:-1]
        keep = torch.tensor(s.loss_mask[1:], dtype=torch.bool)
        picked = log_p.gather(1, torch.tensor(s.input_ids[1:])[:, None])[:, 0]
        columns = attention_mask[b].nonzero()[1:, 0]
        lp = lp.index_put((torch.full_like(columns, b), columns), torch.where(keep, picked, 0.0))
        ent = ent.index_put((torch.full_like(columns, b), columns),
                            torch.where(keep, -(log_p.exp() * log_p).sum(-1), 0.0))
    return lp, ent


def rl_inputs(values, mask, seed=3):
    """The rollout's side, the same on every rank: old and reference log-probs near the current
    ones (ratios inside and outside every clip range), advantages per sequence and per token."""
    g = torch.Generator().manual_seed(seed)
    m = mask.double()
    B, T = mask.shape
    base = values.detach()
    ref = base + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64) * m
    return SimpleNamespace(old=base + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64) * m, ref=ref,
                           adv_seq=torch.randn(B, generator=g, dtype=torch.float64),
                           adv_tok=torch.randn(B, T, generator=g, dtype=torch.float64) * m)


def objectives(lp, ent, mask, d, mesh=None):
    """Each objective's loss, by name: verl's and TRL's normalisations, KL k1/k2/k3, the entropy
    bonus, per-sequence and per-token advantages, the dual clip, DPO on two pairs (rows 0, 2
    chosen; 1, 3 rejected: one with images, one text-only each)."""
    import mmsp.rl as rl

    def dpo():
        seq, ref = rl.sequence_logps(lp, mask), rl.sequence_logps(d.ref, mask)
        return rl.dpo_loss(seq[[0, 2]], seq[[1, 3]], ref[[0, 2]], ref[[1, 3]], beta=0.1, mesh=mesh)

    return {
        "grpo (seq-mean-token-mean, k3)": lambda: rl.policy_loss(
            lp, d.old, d.adv_seq, mask, agg="seq-mean-token-mean", ref_logprobs=d.ref, kl_coef=0.05,
            mesh=mesh).loss,
        "ppo (token-mean, dual clip, k1, entropy)": lambda: rl.policy_loss(
            lp, d.old, d.adv_tok, mask, agg="token-mean", clip_ratio_low=0.2, clip_ratio_high=0.28,
            clip_ratio_c=3.0, ref_logprobs=d.ref, kl_coef=0.1, kl_type="k1", entropy=ent, entropy_coef=0.01,
            mesh=mesh).loss,
        "seq-mean-token-sum, k2, entropy": lambda: rl.policy_loss(
            lp, d.old, d.adv_seq, mask, agg="seq-mean-token-sum", ref_logprobs=d.ref, kl_coef=0.02, kl_type="k2",
            entropy=ent, entropy_coef=0.03, mesh=mesh).loss,
        "seq-mean-token-sum-norm (Dr. GRPO)": lambda: rl.policy_loss(
            lp, d.old, d.adv_tok, mask, agg="seq-mean-token-sum-norm", scale_factor=64.0, mesh=mesh).loss,
        "dpo (sigmoid)": dpo,
    }


def _tolerances(family_name):
    """(values: absolute, loss: relative, gradients: relative and absolute). Qwen3.5: transformers
    runs Gated DeltaNet in float32 inside a float64 model, mmsp's ops in float64 (as sp_checks.py:
    an absolute floor at float32's rounding for gradients that are small themselves)."""
    return (2e-6, 5e-8, 1e-4, 1e-7) if family_name == "qwen3_5" else (1e-10, 1e-12, 1e-9, 1e-15)


def _assert_values(got, want, atol, what):
    err = (got - want).abs().max().item()
    assert err <= atol, f"{what}: max |difference| {err:.3e} > {atol}"


def rl_objectives_equal_one_process(rank, world, family_names, ring, ulysses):
    """For each family: the patched model's token_logprobs and token_entropy [B, T] equal
    transformers' log_softmax at the labels (one process), right- and left-padded rows; then
    every objective of `objectives` on them: the loss and every gradient equal one process's."""
    import mmsp

    for name in family_names:
        family = _families().FAMILIES[name]
        model = _families().build_model(family).train()
        reference = copy.deepcopy(model)
        samples = rl_samples(family)
        batch = left_pad(sp_checks.hf_batch(family, samples), [2, 3])
        mesh = mmsp.Mesh(dp=world // (ring * ulysses), ring=ring, ulysses=ulysses)
        mmsp.patch(model, mesh)
        what = f"{name} on dp {mesh.dp} x ring {ring} x ulysses {ulysses}, rank {rank}"
        atol, loss_rtol, grad_rtol, grad_atol = _tolerances(name)
        want_lp, want_ent = reference_values(reference, family, samples, batch["attention_mask"], TEMPERATURE)
        out = model(**batch, return_token_logprobs=True, return_token_entropy=True, temperature=TEMPERATURE)
        _assert_values(out.token_logprobs, want_lp, atol, f"{what}: token_logprobs")
        _assert_values(out.token_entropy, want_ent, atol, f"{what}: token_entropy")
        mask = batch["labels"] != -100
        d = rl_inputs(want_lp, mask)
        mine = objectives(out.token_logprobs, out.token_entropy, mask, d, mesh)
        theirs = objectives(want_lp, want_ent, mask, d)
        for objective, loss in mine.items():
            want = theirs[objective]()
            want.backward(retain_graph=True)
            got = loss()
            got.backward(retain_graph=True)
            assert abs(got.item() - want.item()) <= loss_rtol * abs(want.item()), \
                f"{what}, {objective}: loss {got.item()!r} != {want.item()!r}"
            sp_checks.assert_gradients_equal(model, reference, f"{what}, {objective}", grad_rtol, grad_atol)
            model.zero_grad(set_to_none=True)
            reference.zero_grad(set_to_none=True)


def per_rank_losses_average_as_ddp(rank, world, family_name, per_rank):
    """batch="per_rank": rank r passes the sequences per_rank[r] and writes its loss on its own
    rows; the gradients equal one process's gradient of the mean of those losses (DDP's)."""
    import mmsp
    import mmsp.rl as rl

    family = _families().FAMILIES[family_name]
    model = _families().build_model(family).train()
    reference = copy.deepcopy(model)
    pool = rl_samples(family)
    mmsp.patch(model, mmsp.Mesh(ring=world), batch="per_rank")
    total = None
    for r, rows in enumerate(per_rank):
        samples = [pool[i] for i in rows]
        batch = sp_checks.hf_batch(family, samples)
        lp, _ = reference_values(reference, family, samples, batch["attention_mask"], 1.0)
        mask = batch["labels"] != -100
        d = rl_inputs(lp, mask, seed=10 + r)
        loss = rl.policy_loss(lp, d.old, d.adv_seq, mask, agg="seq-mean-token-mean").loss / world
        total = loss if total is None else total + loss
        if r == rank:
            mine = (batch, d)
    total.backward()
    batch, d = mine
    out = model(**batch, return_token_logprobs=True)
    mask = batch["labels"] != -100
    assert out.token_logprobs.shape == batch["labels"].shape
    rl.policy_loss(out.token_logprobs, d.old, d.adv_seq, mask, agg="seq-mean-token-mean").loss.backward()
    sp_checks.assert_gradients_equal(model, reference, f"{family_name}, per-rank rows {per_rank}, rank {rank}")


# --- against TRL ---------------------------------------------------------------------------------

def _torchrun_environment(rank, world):
    """What torchrun sets, for accelerate (inside TRL's trainers) to see the processes."""
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "LOCAL_WORLD_SIZE": str(world)})


def _tiny_tokenizer(folder):
    """A tokenizer for TRL's constructors (they read its pad and eos tokens): tiny_models.py's."""
    from transformers import AutoTokenizer

    import tiny_models

    tiny_models.build("qwen2_vl", folder)
    return AutoTokenizer.from_pretrained(folder)


def exact_fused_head(model, temperature):
    """TRL's fused-head protocol on the unpatched model, in float64: `model(..., labels=labels,
    fused_lm_head=True)` gives log_probs and entropy [B, T - 1] (0 where the label is -100) from
    transformers' logits and log_softmax. TRL's own head (add_fused_lm_head) computes in float32
    (measured: 4e-7 from float64's log_softmax), which would hide what fp64 checks."""
    import types

    from transformers.utils import ModelOutput

    forward = model.forward

    def fused(self, *args, labels=None, fused_lm_head=False, **kwargs):
        if not fused_lm_head:  # as TRL's: the model's own forward
            return forward(*args, labels=labels, **kwargs)
        kwargs.pop("use_cache", None)
        z = forward(*args, **kwargs).logits[:, :-1] / temperature
        log_p = z.log_softmax(-1)
        keep = labels[:, 1:] != -100
        picked = log_p.gather(2, labels[:, 1:].clamp(min=0)[..., None])[..., 0]
        return ModelOutput(log_probs=torch.where(keep, picked, 0.0),
                           entropy=torch.where(keep, -(log_p.exp() * log_p).sum(-1), 0.0),
                           mean_logits=torch.where(keep, z.detach().mean(-1), 0.0),
                           is_top1=(z.argmax(-1) == labels[:, 1:]) & keep)

    model.forward = types.MethodType(fused, model)


def grpo_batch(family, samples, completion=6, seed=4):
    """TRL's GRPO inputs for `samples` cut into prompt (all but the last `completion` tokens,
    left-padded) and completion (right-padded, one row a token shorter), with given
    advantages, old and reference log-probs (near the tiny random model's, log(1/640) = -6.46:
    ratios inside and outside both clip bounds, k3 below verl's clamp, which TRL has not)."""
    g = torch.Generator().manual_seed(seed)
    B = len(samples)
    prompts = [s.input_ids[:-completion] for s in samples]
    completions = [s.input_ids[-completion:] for s in samples]
    completions[-1] = completions[-1][:-1]
    P, C = max(map(len, prompts)), completion
    out = {"prompt_ids": torch.zeros(B, P, dtype=torch.long), "prompt_mask": torch.zeros(B, P, dtype=torch.long),
           "completion_ids": torch.zeros(B, C, dtype=torch.long),
           "completion_mask": torch.zeros(B, C, dtype=torch.long)}
    for b, (p, c) in enumerate(zip(prompts, completions)):
        out["prompt_ids"][b, P - len(p):] = torch.tensor(p)
        out["prompt_mask"][b, P - len(p):] = 1
        out["completion_ids"][b, :len(c)] = torch.tensor(c)
        out["completion_mask"][b, :len(c)] = 1
    m = out["completion_mask"].double()
    out["advantages"] = torch.randn(B, generator=g, dtype=torch.float64)
    out["old_per_token_logps"] = (-6.45 + 0.3 * torch.randn(B, C, generator=g, dtype=torch.float64)) * m
    out["ref_per_token_logps"] = (-6.45 + 0.3 * torch.randn(B, C, generator=g, dtype=torch.float64)) * m
    images = [img for s in samples for img in s.images]
    if images:
        out["pixel_values"] = torch.cat([img.pixels for img in images])
        out["image_grid_thw"] = torch.tensor([img.grid for img in images])
        out["num_images"] = [len(s.images) for s in samples]
        ids = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
        out["mm_token_type_ids"] = (ids == family.image_token).int()
    return out


def trl_grpo_loss_equals_one_process(rank, world, ring, ulysses, folder):
    """TRL's own GRPO loss (GRPOTrainer._compute_loss: its fused-head call, clipping, KL,
    seq-mean-token-mean) on given old and reference log-probs and advantages, prompts
    left-padded with images, run on a patched Qwen2-VL on ring x ulysses = the same code on the
    unpatched model (TRL's fused head) on one process: loss and every gradient (fp64); and
    mmsp.rl.policy_loss on the patched model's token_logprobs = TRL's loss."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    import mmsp
    import mmsp.rl as rl

    _torchrun_environment(rank, world)
    families = _families()
    family = families.FAMILIES["qwen2_vl"]
    model = families.build_model(family).train()
    reference = families.build_model(family).train()
    args = GRPOConfig(output_dir=os.path.join(folder, f"out{rank}"), per_device_train_batch_size=4,
                      num_generations=4, max_completion_length=6, beta=0.0, loss_type="grpo", temperature=0.8,
                      epsilon=0.2, epsilon_high=0.28, use_cpu=True, report_to=[], save_strategy="no")
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
                          train_dataset=Dataset.from_list([{"prompt": "a"}] * 4),
                          processing_class=_tiny_tokenizer(os.path.join(folder, f"tok{rank}")))
    trainer.beta = 0.04  # the KL term on the given reference log-probs (no reference model needed)
    trainer.current_gradient_accumulation_steps = 1  # what train() sets
    exact_fused_head(reference, 0.8)
    mesh = mmsp.Mesh(ring=ring, ulysses=ulysses)
    mmsp.patch(model, mesh)  # after the trainer: its fused-head temperature is kept
    samples = rl_samples(family)
    inputs = grpo_batch(family, samples)
    want = trainer._compute_loss(reference, inputs)
    want.backward()
    got = trainer._compute_loss(model, inputs)
    got.backward()
    what = f"TRL's GRPO loss on ring {ring} x ulysses {ulysses}, rank {rank}"
    assert abs(got.item() - want.item()) <= 1e-12 * abs(want.item()), f"{what}: {got.item()!r} != {want.item()!r}"
    sp_checks.assert_gradients_equal(model, reference, what)
    # mmsp.rl's policy_loss with TRL's options on the patched model's own [B, T] values: TRL's loss.
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    labels = ids.masked_fill(attention == 0, -100)
    labels[:, :inputs["prompt_ids"].shape[1]] = -100
    batch = {k: inputs[k] for k in ("pixel_values", "image_grid_thw")}
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, attention_mask=attention, labels=labels, return_token_logprobs=True, **batch)
    C = inputs["completion_ids"].shape[1]
    mask = inputs["completion_mask"].bool()
    result = rl.policy_loss(out.token_logprobs[:, -C:], inputs["old_per_token_logps"], inputs["advantages"], mask,
                            agg="seq-mean-token-mean", clip_ratio_low=0.2, clip_ratio_high=0.28,
                            ref_logprobs=inputs["ref_per_token_logps"], kl_coef=0.04, kl_type="k3",
                            kl_bias_correction=True)  # TRL's use_bias_correction_kl, on by default
    assert abs(result.loss.item() - want.item()) <= 1e-12 * abs(want.item()), \
        f"{what}: mmsp.rl.policy_loss {result.loss.item()!r} != TRL's {want.item()!r}"
    result.loss.backward()
    sp_checks.assert_gradients_equal(model, reference, f"{what}: mmsp.rl.policy_loss")


def dpo_batch(family, samples):
    """TRL's DPO collator's layout for two pairs (chosen: samples 0 and 2, rejected: 1 and 3; one
    of each with images): rows [chosen..., rejected...], completion_mask = the loss mask."""
    order = [samples[i] for i in (0, 2, 1, 3)]
    batch = sp_checks.hf_batch(family, order)
    batch["completion_mask"] = (batch.pop("labels") != -100).long()
    return batch, order


def _dpo_trainer(model, ref_model, folder, rank, **config):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    words = ["What is this?", "A cat.", "A dog on the left.", "A red square.", "Fine, thanks.", "Hello there."]
    pairs = [{"prompt": words[i % 6], "chosen": " " + words[(i + 1) % 6], "rejected": " " + words[(i + 3) % 6]}
             for i in range(8)]
    args = DPOConfig(output_dir=os.path.join(folder, f"out{rank}"), beta=0.1, use_cpu=True, report_to=[],
                     save_strategy="no", remove_unused_columns=False, disable_tqdm=True, **config)
    return DPOTrainer(model=model, ref_model=ref_model, args=args, train_dataset=Dataset.from_list(pairs),
                      processing_class=_tiny_tokenizer(os.path.join(folder, f"tok{rank}")))


def trl_dpo_loss_equals_one_process(rank, world, ring, ulysses, folder):
    """TRL's own DPO loss (DPOTrainer._compute_loss, sigmoid) on two pairs with images, the
    policy patched on ring x ulysses = the same code on the unpatched policy on one process (a
    float64 fused head: exact_fused_head): loss and every gradient; and mmsp.rl.dpo_loss on the
    patched model's token_logprobs = TRL's loss, gradients included."""
    import mmsp
    import mmsp.rl as rl

    _torchrun_environment(rank, world)
    families = _families()
    family = families.FAMILIES["qwen2_vl"]
    model, reference, ref_model = (families.build_model(family).train() for _ in range(3))
    ref_model.eval()
    trainer = _dpo_trainer(model, ref_model, folder, rank, per_device_train_batch_size=2)
    exact_fused_head(reference, 1.0)
    exact_fused_head(ref_model, 1.0)
    mmsp.patch(model, mmsp.Mesh(ring=ring, ulysses=ulysses))
    inputs, rows = dpo_batch(family, rl_samples(family))
    want = trainer._compute_loss(reference, inputs, return_outputs=False)
    want.backward()
    got = trainer._compute_loss(model, inputs, return_outputs=False)
    got.backward()
    what = f"TRL's DPO loss on ring {ring} x ulysses {ulysses}, rank {rank}"
    assert abs(got.item() - want.item()) <= 1e-12 * abs(want.item()), f"{what}: {got.item()!r} != {want.item()!r}"
    sp_checks.assert_gradients_equal(model, reference, what)
    model.zero_grad(set_to_none=True)
    labels = inputs["input_ids"].masked_fill(inputs["completion_mask"] == 0, -100)
    mask = labels != -100
    keys = ("input_ids", "attention_mask", "pixel_values", "image_grid_thw")
    out = model(**{k: inputs[k] for k in keys}, labels=labels, return_token_logprobs=True)
    with torch.no_grad():
        ref_lp, _ = reference_values(ref_model, family, rows, inputs["attention_mask"], 1.0)
    seq, ref = rl.sequence_logps(out.token_logprobs, mask), rl.sequence_logps(ref_lp, mask)
    loss = rl.dpo_loss(seq[:2], seq[2:], ref[:2], ref[2:], beta=0.1)
    assert abs(loss.item() - want.item()) <= 1e-12 * abs(want.item()), \
        f"{what}: mmsp.rl.dpo_loss {loss.item()!r} != TRL's {want.item()!r}"
    loss.backward()
    sp_checks.assert_gradients_equal(model, reference, f"{what}: mmsp.rl.dpo_loss")


def _dpo_image_pairs(n):
    """n preference pairs in TRL's conversational vision format: an image (three sizes) and a
    question, a short chosen and a longer rejected answer."""
    from PIL import Image

    def say(role, *parts):
        return [{"role": role, "content": [{"type": "image"} if p is None else {"type": "text", "text": p}
                                           for p in parts]}]

    answers = ["A cat.", "A dog on the left.", "A red square.", "Fine, thanks."]
    return [{"images": [Image.new("RGB", (42 + 14 * (i % 3), 42), (40 * i, 200 - 20 * i, 90))],
             "prompt": say("user", None, "What is this?"), "chosen": say("assistant", answers[i % 4]),
             "rejected": say("assistant", answers[(i + 1) % 4] + " " + answers[(i + 2) % 4])} for i in range(n)]


def trl_dpo_train(rank, world, folder, out):
    """TRL's DPOTrainer.train(), unmodified, with a reference model, on a tiny Qwen2-VL written
    by tiny_models.py (float64) and 8 image-question preference pairs: two optimizer steps of
    two accumulated micro-batches (SGD: a gradient's error shows in the weights as it is). On 2
    ranks the policy is patched by mmsp (ring 2, batch="per_rank": each rank's loader gives it
    its pairs) after the trainer is built; on 1 process it is not, with twice the pairs a
    micro-batch, and policy and reference answer TRL's fused-head call in float64
    (exact_fused_head: TRL's own head computes in float32). Rank 0 saves the policy's weights
    before and after, the trainer's log and its wrapper of the policy."""
    from datasets import Dataset
    from transformers import AutoConfig, AutoModelForImageTextToText
    from trl import DPOConfig, DPOTrainer

    import mmsp
    import tiny_models

    if world > 1:  # one process: no torchrun variables, so accelerate runs it as one (no DDP)
        _torchrun_environment(rank, world)
    _families()  # (transformers' logging set to errors)
    directory = os.path.join(folder, f"model{rank}")
    processor = tiny_models.build("qwen2_vl", directory)
    torch.manual_seed(0)
    # Each model its own config object: the patch sets the policy's attention in its config.
    model, ref_model = (AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(directory),
                                                                dtype=torch.float64) for _ in range(2))
    model.train()
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    args = DPOConfig(output_dir=os.path.join(folder, f"out{rank}"), beta=0.1, use_cpu=True, bf16=False,
                     report_to=[], save_strategy="no", disable_tqdm=True, per_device_train_batch_size=4 // world,
                     gradient_accumulation_steps=2, max_steps=2, optim="sgd", learning_rate=0.5,
                     lr_scheduler_type="constant", logging_steps=1, seed=0, data_seed=0)
    trainer = DPOTrainer(model=model, ref_model=ref_model, args=args, processing_class=processor,
                         train_dataset=Dataset.from_list(_dpo_image_pairs(8)))
    exact_fused_head(ref_model, 1.0)
    if world > 1:
        mesh = mmsp.Mesh(ring=world)
        mmsp.patch(model, mesh, batch="per_rank")  # after the trainer (its fused LM head would replace the patch's)
    else:
        exact_fused_head(model, 1.0)
    trainer.train()
    if rank == 0:
        torch.save({"before": before, "after": {k: v.detach().clone() for k, v in model.state_dict().items()},
                    "log": [h for h in trainer.state.log_history if "loss" in h],
                    "wrapped": type(trainer.model_wrapped).__name__, "unwrapped": trainer.model_wrapped is model},
                   out)
    if world > 1:  # patched before the trainer: TRL's fused head (its constructor's) reaches the decoder unpatched
        from trl.trainer.utils import add_fused_lm_head

        early = mmsp.patch(AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(directory),
                                                                   dtype=torch.float64), mesh, batch="per_rank")
        add_fused_lm_head(early)
        ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
        _refused(lambda: early(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids, fused_lm_head=True),
                 "attention got a batch of 2 rows", "patch after building the trainer")


def assert_dpo_runs_equal(got, want):
    """Two trl_dpo_train results (got: mmsp on 2 ranks, want: one process): not wrapped in DDP; the
    same start; every weight's change equal to 1e-12 of the change; TRL's logged metrics (float64,
    gathered over the ranks) to 1e-12 relative (1e-15 absolute); the logged loss to 3e-7 relative:
    the Trainer sums it in a float32 tensor (_tr_loss), per rank on 2 ranks (then averaged), so
    the two runs round it differently (one float32 ulp measured)."""
    assert got["unwrapped"], f"the trainer wrapped the patched policy in {got['wrapped']}"
    assert len(got["log"]) == len(want["log"]) == 2, (got["log"], want["log"])
    for step, (g, w) in enumerate(zip(got["log"], want["log"]), 1):
        assert g.keys() == w.keys(), (g, w)
        for key, value in w.items():
            tolerance = 3e-7 * abs(value) if key == "loss" else 1e-12 * abs(value) + 1e-15
            assert abs(g[key] - value) <= tolerance, f"step {step}, {key}: {g[key]!r} != one process's {value!r}"
    for name, before in want["before"].items():
        assert torch.equal(before, got["before"][name]), f"{name}: the two runs started from different weights"
        step, step_got = want["after"][name] - before, got["after"][name] - before
        err, scale = (step_got - step).norm().item(), step.norm().item()
        assert err <= 1e-12 * scale, f"{name}: its change differs by {err:.3e} (the change: {scale:.3e})"
    assert all((want["after"][n] - b).norm() > 0 for n, b in want["before"].items()), "a weight did not train"


def _refused(fn, *needles):
    """fn() must raise a ValueError whose message holds every needle."""
    try:
        fn()
    except ValueError as e:
        missing = [n for n in needles if n not in str(e)]
        assert not missing, f"the error does not name {missing}: {e}"
        return
    raise AssertionError(f"no error; expected one naming {needles}")


def bad_inputs_refused_on_every_rank(rank, world):
    """Bad RL inputs are a ValueError naming the field, the row (the batch's sample) and the
    rule on every rank, also when only one rank's input is bad, before the backward's exchange:
    advantages of the wrong length, a NaN old log-prob of a labelled token (on rank 1 only), a
    missing reference, DPO pairs with one side missing, a NaN reference sum."""
    import mmsp
    import mmsp.rl as rl

    mesh = mmsp.Mesh(ring=world)
    B, T = 3, 5
    lp = torch.zeros(B, T, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[:, 0] = False
    old, adv = torch.zeros(B, T, dtype=torch.float64), torch.ones(B, dtype=torch.float64)
    _refused(lambda: rl.policy_loss(lp, old, torch.ones(B + 1, dtype=torch.float64), mask, mesh=mesh),
             "advantages has shape [4]", "[3, 5] or [3] (one per sequence)")
    nan_old = old.clone()
    if rank == 1:
        nan_old[2, 3] = float("nan")
    _refused(lambda: rl.policy_loss(lp, nan_old, adv, mask, mesh=mesh),
             "rank 1: old_logprobs is nan at row 2, token 3 (sample 2 of the batch)", "must be finite")
    unread = old.clone()
    unread[:, 0] = float("nan")  # unlabelled tokens are not read: no error for them
    rl.policy_loss(lp, unread, adv, mask, mesh=mesh)
    _refused(lambda: rl.policy_loss(lp, old, adv, mask, kl_coef=0.1, mesh=mesh), "ref_logprobs is missing")
    seq = rl.sequence_logps(lp, mask)
    _refused(lambda: rl.dpo_loss(seq[:2], seq[2:], seq[:2], seq[2:], mesh=mesh),
             "2 chosen sequences but rejected_logps has shape [1]", "every pair needs both sides")
    ref = torch.tensor([0.0, float("nan") if rank == 0 else 0.0], dtype=torch.float64)
    _refused(lambda: rl.dpo_loss(seq[:2], seq[1:], ref, ref, mesh=mesh),
             "rank 0: ref_chosen_logps is nan at row 1")
