"""What each rank runs in test_torch_api.py: mmsp's ops and planner on this rank's shard,
and the single-process computation of the whole batch that they must equal (fp64)."""
import json
import math
import os
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "tiny-qwen2-vl.json")
BATCH = os.path.join(ROOT, "examples", "batch-qwen2-vl.json")
TOL = 1e-9


def batch():
    with open(BATCH, encoding="utf-8") as f:
        return json.load(f)


def meshes(world):
    """Every dp=1 mesh of the world: (ring, ulysses)."""
    return [(world // u, u) for u in range(1, world + 1) if world % u == 0]


def per_sequence(lengths, *shape, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn((n,) + shape, generator=g, dtype=torch.float64) for n in lengths]


def reference_attention(q, k, v):
    """One sequence, causal, GQA: q [n, H, D], k/v [n, H_kv, D] -> [n, H, D]."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True)
    return out.transpose(0, 1)


def assert_close(got, want, what):
    err = (got - want).abs().max().item()
    scale = max(want.abs().max().item(), 1e-30)
    assert err <= TOL * scale, f"{what}: max |difference| {err:.3e} > {TOL} x {scale:.3e}"


def summed_over_ranks(shard, local_grad, lengths, trailing):
    """Per-sequence gradients from every rank's slots, summed over ranks (dp = 1)."""
    full = [torch.zeros((n,) + trailing, dtype=torch.float64) for n in lengths]
    for slot, (s, i) in enumerate(zip(shard.sequence.tolist(), shard.index_in_sequence.tolist())):
        if s >= 0:
            full[s][i] += local_grad[slot]
    flat = torch.cat([f.reshape(-1) for f in full])
    dist.all_reduce(flat)
    out, at = [], 0
    for f in full:
        out.append(flat[at:at + f.numel()].view_as(f))
        at += f.numel()
    return out


def attention_equals_one_process(rank, world):
    import mmsp

    b = batch()
    lengths = [len(s["input_ids"]) for s in b["sequences"]]
    H_kv = max(world, 2)  # GQA with heads every Ulysses degree of the world divides
    H, D = 2 * H_kv, 8
    q_all = per_sequence(lengths, H, D, seed=1)
    k_all = per_sequence(lengths, H_kv, D, seed=2)
    v_all = per_sequence(lengths, H_kv, D, seed=3)
    w_all = per_sequence(lengths, H, D, seed=4)  # the loss: sum(out · w)
    # The reference: each sequence alone, on this process.
    ref_q = [t.clone().requires_grad_() for t in q_all]
    ref_k = [t.clone().requires_grad_() for t in k_all]
    ref_v = [t.clone().requires_grad_() for t in v_all]
    ref_out = [reference_attention(q, k, v) for q, k, v in zip(ref_q, ref_k, ref_v)]
    sum((o * w).sum() for o, w in zip(ref_out, w_all)).backward()
    for ring, ulysses in meshes(world):
        for placement in ("zigzag", "adaptive"):
            mesh = mmsp.Mesh(ring=ring, ulysses=ulysses)
            shard = mmsp.plan(CONFIG, b, mesh, placement=placement)
            what = f"{world} ranks, ring {ring} x ulysses {ulysses}, {placement}, rank {rank}"
            q = shard.gather(q_all).requires_grad_()
            k = shard.gather(k_all).requires_grad_()
            v = shard.gather(v_all).requires_grad_()
            out = mmsp.ops.attention(q, k, v, shard, mesh)
            (out * shard.gather(w_all)).sum().backward()
            for slot, (s, i) in enumerate(zip(shard.sequence.tolist(), shard.index_in_sequence.tolist())):
                if s >= 0:
                    assert_close(out[slot], ref_out[s][i].detach(), f"{what}: output of sequence {s} token {i}")
            for name, grad, ref, shape in (("q", q.grad, ref_q, (H, D)), ("k", k.grad, ref_k, (H_kv, D)),
                                           ("v", v.grad, ref_v, (H_kv, D))):
                got = summed_over_ranks(shard, grad, lengths, shape)
                for s in range(len(lengths)):
                    assert_close(got[s], ref[s].grad, f"{what}: d{name} of sequence {s}")


def reference_conv(x, weight):
    """One sequence: causal depthwise conv then SiLU. x [n, C], weight [C, W]."""
    W = weight.shape[1]
    padded = F.pad(x.t().unsqueeze(0), (W - 1, 0))
    return F.silu(F.conv1d(padded, weight.unsqueeze(1), groups=x.shape[1])[0].t())


def reference_rule(q, k, v, g, beta):
    """One sequence, token by token: S_t = e^{g_t}(I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T,
    o_t = S_t^T q_t / sqrt(K)."""
    n, H, K = q.shape
    S = q.new_zeros(H, K, v.shape[2])
    out = []
    for t in range(n):
        kt, vt, bt = k[t], v[t], beta[t][:, None, None]
        S = torch.exp(g[t])[:, None, None] * (S - bt * kt[:, :, None] * torch.einsum("hk,hkv->hv", kt, S)[:, None, :])
        S = S + bt * kt[:, :, None] * vt[:, None, :]
        out.append(torch.einsum("hkv,hk->hv", S, q[t]) / math.sqrt(K))
    return torch.stack(out)


def gated_delta_equals_one_process(rank, world):
    import mmsp

    b = batch()
    lengths = [len(s["input_ids"]) for s in b["sequences"]]
    H, K, V, C, W = 2, 8, 4, 6, 4
    x_all = per_sequence(lengths, C, seed=5)
    w_conv = torch.randn(C, W, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    q_all = [F.normalize(t, dim=-1) for t in per_sequence(lengths, H, K, seed=7)]
    k_all = [F.normalize(t, dim=-1) for t in per_sequence(lengths, H, K, seed=8)]
    v_all = per_sequence(lengths, H, V, seed=9)
    g_all = [-torch.rand(n, H, generator=torch.Generator().manual_seed(10 + n), dtype=torch.float64) for n in lengths]
    beta_all = [torch.rand(n, H, generator=torch.Generator().manual_seed(20 + n), dtype=torch.float64)
                for n in lengths]
    w_out = per_sequence(lengths, H, V, seed=11)
    w_cout = per_sequence(lengths, C, seed=12)

    ref = {n: [t.clone().requires_grad_() for t in a]
           for n, a in (("q", q_all), ("k", k_all), ("v", v_all), ("g", g_all), ("beta", beta_all), ("x", x_all))}
    ref_w = w_conv.clone().requires_grad_()
    loss = 0
    ref_rule, ref_conv = [], []
    for s in range(len(lengths)):
        o = reference_rule(ref["q"][s], ref["k"][s], ref["v"][s], ref["g"][s], ref["beta"][s])
        c = reference_conv(ref["x"][s], ref_w)
        ref_rule.append(o.detach())
        ref_conv.append(c.detach())
        loss = loss + (o * w_out[s]).sum() + (c * w_cout[s]).sum()
    loss.backward()

    mesh = mmsp.Mesh(ring=world)
    shard = mmsp.plan(CONFIG, b, mesh)
    what = f"ring of {world}, rank {rank}"
    local = {n: shard.gather(a).requires_grad_() for n, a in
             (("q", q_all), ("k", k_all), ("v", v_all), ("g", g_all), ("beta", beta_all), ("x", x_all))}
    w = w_conv.clone().requires_grad_()
    o = mmsp.ops.gated_delta_rule(local["q"], local["k"], local["v"], local["g"], local["beta"], shard, mesh)
    c = mmsp.ops.gated_delta_conv(local["x"], w, shard, mesh)
    ((o * shard.gather(w_out)).sum() + (c * shard.gather(w_cout)).sum()).backward()
    for slot, (s, i) in enumerate(zip(shard.sequence.tolist(), shard.index_in_sequence.tolist())):
        if s >= 0:
            assert_close(o[slot], ref_rule[s][i], f"{what}: rule output of sequence {s} token {i}")
            assert_close(c[slot], ref_conv[s][i], f"{what}: conv output of sequence {s} token {i}")
    for n, trailing in (("q", (H, K)), ("k", (H, K)), ("v", (H, V)), ("g", (H,)), ("beta", (H,)), ("x", (C,))):
        got = summed_over_ranks(shard, local[n].grad, lengths, trailing)
        for s in range(len(lengths)):
            assert_close(got[s], ref[n][s].grad, f"{what}: d{n} of sequence {s}")
    dist.all_reduce(w.grad)
    assert_close(w.grad, ref_w.grad, f"{what}: d(conv weight)")


def plan_equals_mmsp_plan(rank, world, binary):
    """mmsp.plan's shard is `mmsp plan`'s, for every rank of every mesh."""
    import subprocess

    import mmsp

    for ring, ulysses in meshes(world):
        mesh = mmsp.Mesh(ring=ring, ulysses=ulysses)
        shard = mmsp.plan(CONFIG, batch(), mesh)
        cli = subprocess.run([binary, "plan", "--config", CONFIG, "--batch", BATCH, "--ring", str(ring),
                              "--ulysses", str(ulysses), "--rank", str(rank), "--format", "json"],
                             check=True, capture_output=True, text=True)
        assert shard.plan_json == json.loads(cli.stdout), f"ring {ring} x ulysses {ulysses}, rank {rank}"
        # ... and the tensors are the plan's.
        want = shard.plan_json["ranks"][0]
        assert shard.labels.tolist() == want["labels"]
        assert shard.positions.tolist() == want["positions"]
        assert shard.packed_index == want["tokens"]


def bad_input_is_a_value_error(rank, world):
    """Each mistake is a ValueError naming the value on every rank, before any collective:
    the ranks then still agree (a correct call after it works)."""
    import mmsp

    b = batch()
    try:
        mmsp.Mesh(ring=world + 1)
        raise AssertionError("a mesh larger than the world was accepted")
    except ValueError as e:
        assert f"world size {world}" in str(e) and f"ring({world + 1})" in str(e), str(e)
    mesh = mmsp.Mesh(ulysses=world)
    shard = mmsp.plan(CONFIG, b, mesh)
    T = len(shard.token_ids)
    q = torch.randn(T, 3, 8, dtype=torch.float64)  # 3 heads: ulysses 2 cannot split them
    kv = torch.randn(T, 3, 8, dtype=torch.float64)
    try:
        mmsp.ops.attention(q, kv, kv, shard, mesh)
        raise AssertionError("3 heads over ulysses 2 were accepted")
    except ValueError as e:
        assert "ulysses degree 2" in str(e) and "(3)" in str(e), str(e)
    # A shard planned for a ring of 2 on a mesh whose ring has 1 rank: the group is the wrong size.
    other = mmsp.plan(CONFIG, b, rank=rank, ring=world)
    mesh_u = mesh
    q = torch.randn(T, 4, 8, dtype=torch.float64)
    try:
        mmsp.ops.attention(q, q, q, other, mesh_u)
        raise AssertionError("a shard of another mesh was accepted")
    except ValueError as e:
        assert f"{world} ring shares for a ring group of 1" in str(e), str(e)
    try:
        mmsp.ops.attention(q.to("meta"), q.to("meta"), q.to("meta"), shard, mesh)
        raise AssertionError("meta tensors were accepted")
    except ValueError as e:
        assert "meta" in str(e), str(e)
    try:
        mmsp.plan(CONFIG, b, rank=world, dp=1, ring=world)
        raise AssertionError("a rank outside the mesh was accepted")
    except ValueError as e:
        assert f"rank {world} is outside" in str(e), str(e)
    # mmsp.patch refuses what it cannot train exactly, before any collective.
    import sys

    sys.path.insert(0, os.path.join(ROOT, "tests", "hf"))
    import families

    model = families.build_model(families.FAMILIES["qwen2_vl"])
    model.config.text_config.num_attention_heads = 3  # as a config whose heads ulysses 2 cannot split
    try:
        mmsp.patch(model, mesh)
        raise AssertionError("3 heads over ulysses 2 were patched")
    except ValueError as e:
        assert "ulysses degree 2" in str(e) and "(3)" in str(e), str(e)
    hybrid = families.build_model(families.FAMILIES["qwen3_5"])
    try:
        mmsp.patch(hybrid, mesh, placement="adaptive")
        raise AssertionError("qwen3_5 was patched for the adaptive placement")
    except ValueError as e:
        assert "placement 'adaptive' with Gated DeltaNet layers" in str(e), str(e)
    # A family mmsp does not know: named by the model layer's registry (the one family table).
    from transformers import LlamaConfig, LlamaForCausalLM

    text_only = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=2))
    try:
        mmsp.patch(text_only, mesh)
        raise AssertionError("a llama model was patched")
    except ValueError as e:
        assert str(e).startswith("mmsp.patch: ") and 'model_type "llama" is not supported' in str(e) and \
            "qwen2_vl, qwen2_5_vl, qwen3_vl, qwen3_5, qwen3_vl_moe, qwen3_5_moe, llava, internvl" in str(e), str(e)
    # Still in step: a correct call after the refused ones.
    out = mmsp.ops.attention(q, q, q, shard, mesh)
    assert out.shape == q.shape


def hf_batch(family, samples):
    """What a transformers collator gives: input_ids [B, T] right-padded, attention_mask,
    labels (-100 where no loss is taken), the batch's pixels and grids."""
    T = max(len(s.input_ids) for s in samples)
    ids = torch.zeros(len(samples), T, dtype=torch.long)
    mask = torch.zeros(len(samples), T, dtype=torch.long)
    labels = torch.full((len(samples), T), -100, dtype=torch.long)
    for b, s in enumerate(samples):
        n = len(s.input_ids)
        ids[b, :n] = torch.tensor(s.input_ids)
        mask[b, :n] = 1
        keep = torch.tensor(s.loss_mask, dtype=torch.bool)
        labels[b, :n] = torch.where(keep, ids[b, :n], torch.full_like(ids[b, :n], -100))
    images = [img for s in samples for img in s.images]
    out = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    if not images:
        pass
    elif family.kind == "qwen":
        out["pixel_values"] = torch.cat([img.pixels for img in images])
        out["image_grid_thw"] = torch.tensor([img.grid for img in images])
        out["mm_token_type_ids"] = (ids == family.image_token).int()  # the processor's (1: image token)
    elif family.kind == "llava":
        out["pixel_values"] = torch.stack([img.pixels for img in images])
    else:
        out["pixel_values"] = torch.cat([img.pixels for img in images])
    return out


def assert_gradients_equal(model, reference, what, rtol=1e-9, atol=1e-15):
    """Every parameter's gradient in `model` equals `reference`'s (same names), norm-wise:
    |difference| <= rtol |reference| + atol; a gradient the reference lacks counts as zero."""
    ref = dict(reference.named_parameters())
    for name, p in model.named_parameters():
        r = ref[name].grad
        r = torch.zeros_like(ref[name]) if r is None else r
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad  # FSDP2's shards, whole
        err, scale = (g - r).norm().item(), r.norm().item()
        assert err <= rtol * scale + atol, \
            f"{what}: gradient of {name}: |difference| {err:.3e}, |reference| {scale:.3e}"


def patch_equals_one_process(rank, world, family_names, ring, ulysses, placement):
    """transformers' model of each family patched by mmsp on ring x ulysses (dp fills the
    rest) = the unpatched model on one process: the loss and every parameter's gradient, fp64."""
    import sys

    sys.path.insert(0, os.path.join(ROOT, "tests", "hf"))
    from transformers.utils import logging

    logging.set_verbosity_error()
    for name in family_names:
        _patched_family_equals_one_process(rank, world, name, ring, ulysses, placement)


def _patched_family_equals_one_process(rank, world, family_name, ring, ulysses, placement):
    import copy

    import families
    import mmsp

    family = families.FAMILIES[family_name]
    model = families.build_model(family).train()
    reference = copy.deepcopy(model)
    samples = families.make_samples(family)
    want = families.reference_loss(reference, family, samples)
    want.backward()
    mesh = mmsp.Mesh(dp=world // (ring * ulysses), ring=ring, ulysses=ulysses)
    mmsp.patch(model, mesh, placement=placement)
    out = model(**hf_batch(family, samples))
    loss = out.loss
    loss.backward()
    what = f"{family_name} on dp {mesh.dp} x ring {ring} x ulysses {ulysses} ({placement}), rank {rank}"
    # Vision DP: every image encoded once, by one rank of its dp row.
    encoded = torch.tensor([len(out.mmsp_shard.encoder_items)])
    dist.all_reduce(encoded)
    images = sum(len(s.images) for s in samples)
    assert encoded.item() == images, f"{what}: {encoded.item()} encodings of {images} images over the world"
    # transformers runs Qwen3.5's Gated DeltaNet in float32 whatever the model's dtype (mmsp in
    # fp64): that family is compared as tests/hf/test_reference.py compares it.
    loss_rtol, grad_rtol = (5e-9, 1e-4) if family_name == "qwen3_5" else (1e-12, 1e-9)
    assert abs(loss.item() - want.item()) <= loss_rtol * abs(want.item()), \
        f"{what}: loss {loss.item()!r} != {want.item()!r}"
    assert_gradients_equal(model, reference, what, grad_rtol)


def patch_accumulates_gradients(rank, world, ring, ulysses):
    """Gradient accumulation through mmsp.patch, both ways a loop does it — a backward per
    micro-batch, and the micro-batches' losses summed before one backward — equals one
    process accumulating the same micro-batches (fp64, every gradient). The micro-batches:
    tests/hf's two sequences, one each (so some ranks hold no image in each)."""
    import copy
    import sys

    sys.path.insert(0, os.path.join(ROOT, "tests", "hf"))
    from transformers.utils import logging

    import families
    import mmsp

    logging.set_verbosity_error()
    family = families.FAMILIES["qwen2_vl"]
    model = families.build_model(family).train()
    reference = copy.deepcopy(model)
    samples = families.make_samples(family)
    micro = [samples[:1], samples[1:]]
    for m in micro:
        families.reference_loss(reference, family, m).backward()
    mmsp.patch(model, mmsp.Mesh(dp=world // (ring * ulysses), ring=ring, ulysses=ulysses))

    def check(how):
        assert_gradients_equal(model, reference, f"{how} on ring {ring} x ulysses {ulysses}, rank {rank}")
        model.zero_grad(set_to_none=True)

    for m in micro:
        model(**hf_batch(family, m)).loss.backward()
    check("a backward per micro-batch")
    sum(model(**hf_batch(family, m)).loss for m in micro).backward()
    check("micro-batch losses summed, one backward")


def text_sample(seed, n=12):
    """A sequence with no image (a rank whose batch holds only such has no pixels at all)."""
    import families

    gen = torch.Generator().manual_seed(seed)
    words = torch.randint(*families.TEXT_RANGE, (n,), generator=gen).tolist()
    return families.Sample([1] + words + [2], [0] + [1] * (n + 1), [])


def patch_per_rank_batches_equal_one_process(rank, world, ring, ulysses, family_names, per_rank):
    """mmsp.patch(..., batch="per_rank"): rank r passes its own batch per_rank[r] (indices into
    [sample 0, sample 1, a text-only sample]); the loss and every gradient equal the unpatched
    model on one process over the union, rank 0's sequences first (fp64)."""
    import copy
    import sys

    sys.path.insert(0, os.path.join(ROOT, "tests", "hf"))
    from transformers.utils import logging

    import families
    import mmsp

    logging.set_verbosity_error()
    for name in family_names:
        family = families.FAMILIES[name]
        model = families.build_model(family).train()
        reference = copy.deepcopy(model)
        pool = families.make_samples(family) + [text_sample(5)]
        union = [pool[i] for mine in per_rank for i in mine]
        want = families.reference_loss(reference, family, union)
        want.backward()
        mesh = mmsp.Mesh(dp=world // (ring * ulysses), ring=ring, ulysses=ulysses)
        mmsp.patch(model, mesh, batch="per_rank")
        loss = model(**hf_batch(family, [pool[i] for i in per_rank[rank]])).loss
        loss.backward()
        what = f"{name}, per-rank batches {per_rank} on ring {ring} x ulysses {ulysses}, rank {rank}"
        assert abs(loss.item() - want.item()) <= 1e-12 * abs(want.item()), \
            f"{what}: loss {loss.item()!r} != {want.item()!r}"
        assert_gradients_equal(model, reference, what)


def _fp64_loss_forward(model):
    """The unpatched model's forward with the loss taken in float64 from its logits (the mean
    over target tokens; transformers' own loss upcasts only to float32): the one-process
    reference, with mmsp's loss definition, at fp64's precision."""
    import types

    import torch.nn.functional as F
    from transformers.modeling_outputs import CausalLMOutputWithPast

    forward = model.forward

    def fp64(self, labels=None, **batch):
        logits = forward(**batch).logits
        targets = labels[:, 1:]
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100,
                               reduction="sum") / (targets != -100).sum()
        return CausalLMOutputWithPast(loss=loss, logits=logits)

    model.forward = types.MethodType(fp64, model)


def trainer_run(rank, world, ring, ulysses, per_device, out, family_name="qwen2_vl", fsdp=False,
                max_grad_norm=1.0):
    """transformers.Trainer, unmodified, on `world` processes: with world > 1 the model is
    patched by mmsp on ring x ulysses with batch="per_rank" (the Trainer's loader gives each
    rank its own micro-batch), and with fsdp sharded by mmsp.fully_shard before the Trainer
    sees it; with world 1, the unpatched model. Two optimizer steps of two accumulated
    micro-batches each (SGD, so a gradient's error shows in the weights as it is), gradients
    clipped at max_grad_norm. Rank 0 saves the weights before and after (whole), the logged
    losses and gradient norms to `out`."""
    import sys
    import tempfile

    sys.path.insert(0, os.path.join(ROOT, "tests", "hf"))
    from transformers import Trainer, TrainingArguments
    from transformers.utils import logging

    import families
    import mmsp

    logging.set_verbosity_error()
    # What torchrun sets, for accelerate to see the processes this test started.
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "LOCAL_WORLD_SIZE": str(world)})
    family = families.FAMILIES[family_name]
    model = families.build_model(family).train()
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    pool = [s for seed in (1, 2, 3) for s in families.make_samples(family, seed)] + [text_sample(5), text_sample(6)]
    if world > 1:
        mesh = mmsp.Mesh(ring=ring, ulysses=ulysses)
        mmsp.patch(model, mesh, batch="per_rank")
        if fsdp:
            mmsp.fully_shard(model, mesh)
    else:
        _fp64_loss_forward(model)
        model.accepts_loss_kwargs = False  # as the patch: the loss is each micro-batch's mean
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=per_device,
                             gradient_accumulation_steps=2, max_steps=2, learning_rate=0.5, optim="sgd",
                             lr_scheduler_type="constant", logging_steps=1, save_strategy="no", report_to=[],
                             use_cpu=True, remove_unused_columns=False, seed=0, data_seed=0, disable_tqdm=True,
                             max_grad_norm=max_grad_norm)
    trainer = Trainer(model=model, args=args, train_dataset=pool,
                      data_collator=lambda samples: hf_batch(family, samples))
    trainer.train()
    whole = lambda t: t.full_tensor() if hasattr(t, "full_tensor") else t  # noqa: E731 (FSDP2's shards: collective)
    after = {k: whole(v.detach()).clone() for k, v in trainer.model.state_dict().items()}
    if rank == 0:
        log = trainer.state.log_history
        torch.save({"before": before, "after": after, "losses": [h["loss"] for h in log if "loss" in h],
                    "grad_norms": [h["grad_norm"] for h in log if "grad_norm" in h],
                    "sharded": type(next(model.parameters())).__name__,
                    "wrapped": type(trainer.model_wrapped).__name__}, out)


def assert_trainer_runs_equal(got, want):
    """Two trainer_run results: the same start, every weight's change to 1e-9 of the change,
    the logged losses as logged (rounded), something trained, no DDP around the patched model."""
    import pytest

    assert got["wrapped"] != "DistributedDataParallel", "accelerate wrapped the patched model in DDP"
    assert len(got["losses"]) == len(want["losses"]) == 2, (got["losses"], want["losses"])
    assert got["losses"] == pytest.approx(want["losses"], rel=1e-3), (got["losses"], want["losses"])
    for name, before in want["before"].items():
        assert torch.equal(before, got["before"][name]), f"{name}: the two runs started from different weights"
        step, step_got = want["after"][name] - before, got["after"][name] - before
        err, scale = (step_got - step).norm().item(), step.norm().item()
        assert err <= 1e-9 * scale + 1e-15, f"{name}: its change differs by {err:.3e} (the change: {scale:.3e})"
    assert any((want["after"][n] - b).norm() > 0 for n, b in want["before"].items()), "nothing trained"


def per_rank_bad_batch_named_on_every_rank(rank, world):
    """A bad batch on one rank (batch="per_rank") is a ValueError on every rank naming that
    rank and the rule, and the ranks are still in step after it; a bad batch= is refused."""
    import sys

    sys.path.insert(0, os.path.join(ROOT, "tests", "hf"))
    from transformers.utils import logging

    import families
    import mmsp

    logging.set_verbosity_error()
    family = families.FAMILIES["qwen2_vl"]
    model = families.build_model(family).train()
    mesh = mmsp.Mesh(ring=world)
    try:
        mmsp.patch(model, mesh, batch="every_rank")
        raise AssertionError("batch='every_rank' was accepted")
    except ValueError as e:
        assert "batch='every_rank'" in str(e) and "'per_rank'" in str(e), str(e)
    mmsp.patch(model, mesh, batch="per_rank")
    batch = hf_batch(family, families.make_samples(family)[rank % 2:rank % 2 + 1])
    if rank == 1:
        batch["labels"][0, 3] = batch["input_ids"][0, 3] + 1  # a label that is not the next input
    try:
        model(**batch)
        raise AssertionError(f"rank {rank}: rank 1's bad labels were accepted")
    except ValueError as e:
        assert "rank 1's batch: labels[0, 3]" in str(e), f"rank {rank}: {e}"
    dist.barrier()  # still in step


def video_samples(family_name, seed=7):
    """Two sequences mixing images and videos (2 temporal patches each): text, image, text,
    video, text; text, video, text, image, text. Qwen3-VL puts each temporal patch of a video
    in its own block after a timestamp (here two text tokens), as its processor does; the
    first sequence as transformers 5.x writes it, the chat template's <|vision_start|> and
    <|vision_end|> left around those blocks, the second as the released processor did. The
    videos' temporal positions stay below max(h, w)/m, where transformers 5.17 and mmsp place
    the following text alike (docs/plan.md). Returns [(input_ids, loss_mask, images, videos)],
    videos as (pixel rows, [t, h, w])."""
    import families

    family = families.FAMILIES[family_name]
    cfg = families.config_dict(family)
    v = cfg["vision_config"]
    p, tp, m = v["patch_size"], v["temporal_patch_size"], v["spatial_merge_size"]
    gen = torch.Generator().manual_seed(seed)
    words = lambda n: torch.randint(*families.TEXT_RANGE, (n,), generator=gen).tolist()
    start, end, pad = family.start_token, family.end_token, families.FAMILIES[family_name].overrides.get(
        "video_token_id", 604)
    out = []
    for s, layout in enumerate((["text", "image", "text", "video", "text"], ["text", "video", "text", "image", "text"])):
        ids, mask, images, videos = [1], [0], [], []
        for part in layout:
            if part == "text":
                t = words(5)
                ids, mask = ids + t, mask + [1] * len(t)
            elif part == "image":
                img = families.make_image(family, cfg, (4, 4), gen)
                block = [start] + [family.image_token] * img.placeholders + [end]
                ids, mask = ids + block, mask + [0] * len(block)
                images.append(img)
            else:
                t, h, w = 2, 8, 4
                videos.append((families._pixels((t * h * w, 3 * tp * p * p), gen), [t, h, w]))
                frames = [[start] + [pad] * (t * h * w // (m * m)) + [end]]
                if family_name in ("qwen3_vl", "qwen3_5"):  # a timestamp, then one block, per temporal patch
                    frames = [words(2) + [start] + [pad] * (h * w // (m * m)) + [end] for _ in range(t)]
                    wrapped = s == 0  # transformers 5.x: the template's pair around the blocks
                    ids, mask = ids + [start] * wrapped, mask + [0] * wrapped
                    for f in frames:
                        ids, mask = ids + f, mask + [1, 1] + [0] * (len(f) - 2)
                    ids, mask = ids + [end] * wrapped, mask + [0] * wrapped
                else:
                    ids, mask = ids + frames[0], mask + [0] * len(frames[0])
        ids, mask = ids + [2], mask + [1]
        out.append((ids, mask, images, videos))
    return out


def _video_batch(family, seqs, pad_token):
    """transformers' inputs for sequences with videos: ids, mask, labels, the pixels and grids
    of images and videos, mm_token_type_ids (1 image, 2 video), second_per_grid_ts (1 s)."""
    T = max(len(ids) for ids, *_ in seqs)
    ids_t = torch.zeros(len(seqs), T, dtype=torch.long)
    attn = torch.zeros(len(seqs), T, dtype=torch.long)
    labels = torch.full((len(seqs), T), -100, dtype=torch.long)
    for b, (ids, mask, _, _) in enumerate(seqs):
        n = len(ids)
        ids_t[b, :n] = torch.tensor(ids)
        attn[b, :n] = 1
        keep = torch.tensor(mask, dtype=torch.bool)
        labels[b, :n] = torch.where(keep, ids_t[b, :n], torch.full_like(ids_t[b, :n], -100))
    images = [img for _, _, imgs, _ in seqs for img in imgs]
    videos = [vid for *_, vids in seqs for vid in vids]
    out = {"input_ids": ids_t, "attention_mask": attn, "labels": labels,
           "mm_token_type_ids": (ids_t == family.image_token).int() + 2 * (ids_t == pad_token).int()}
    if images:
        out["pixel_values"] = torch.cat([img.pixels for img in images])
        out["image_grid_thw"] = torch.tensor([img.grid for img in images])
    if videos:
        out["pixel_values_videos"] = torch.cat([px for px, _ in videos])
        out["video_grid_thw"] = torch.tensor([grid for _, grid in videos])
        out["second_per_grid_ts"] = torch.ones(len(videos), dtype=torch.float64)
    return out


def patch_videos_equal_one_process(rank, world, ring, ulysses, family_names, fsdp=False, per_rank=None):
    """mmsp.patch on Qwen batches with videos (and images) = the unpatched model on one process,
    each sequence through transformers' forward on its own: loss to 1e-12 and every gradient
    to 1e-9 (fp64); each image and video block encoded once over the world. fsdp: sharded
    with FSDP2 (mmsp.fully_shard) after the patch. per_rank: batch="per_rank", rank r passing
    the sequences per_rank[r] (indices into the two), the step their union in rank order."""
    import copy
    import sys

    sys.path.insert(0, os.path.join(ROOT, "tests", "hf"))
    import torch.nn.functional as F
    from transformers.utils import logging

    import families
    import mmsp

    logging.set_verbosity_error()
    for name in family_names:
        family = families.FAMILIES[name]
        pad = family.overrides.get("video_token_id", 604)
        model = families.build_model(family).train()
        reference = copy.deepcopy(model)
        seqs = video_samples(name)
        if per_rank is not None:
            seqs = [seqs[i] for mine in per_rank for i in mine]
        total, count = None, 0
        for seq in seqs:
            inputs = _video_batch(family, [seq], pad)
            labels = inputs.pop("labels")[0]
            inputs.pop("attention_mask")
            if name != "qwen2_5_vl":
                inputs.pop("second_per_grid_ts", None)
            logits = reference(**inputs).logits[0]
            keep = labels[1:] != -100
            ce = F.cross_entropy(logits[:-1][keep], labels[1:][keep], reduction="sum")
            total, count = (ce if total is None else total + ce), count + int(keep.sum())
        want = total / count
        want.backward()
        mesh = mmsp.Mesh(dp=world // (ring * ulysses), ring=ring, ulysses=ulysses)
        mmsp.patch(model, mesh, batch="shared" if per_rank is None else "per_rank")
        if fsdp:
            mmsp.fully_shard(model, mesh)
        batch = _video_batch(family, seqs if per_rank is None else [video_samples(name)[i] for i in per_rank[rank]],
                             pad)
        if name != "qwen2_5_vl":
            batch.pop("second_per_grid_ts")
        out = model(**batch)
        out.loss.backward()
        what = (f"{name} with videos on ring {ring} x ulysses {ulysses}{', FSDP2' if fsdp else ''}"
                f"{f', per-rank batches {per_rank}' if per_rank else ''}, rank {rank}")
        encoded = torch.tensor([len(out.mmsp_shard.encoder_items)])
        dist.all_reduce(encoded)
        blocks = sum(len(imgs) + sum(vid[1][0] if name in ("qwen3_vl", "qwen3_5") else 1 for vid in vids)
                     for _, _, imgs, vids in seqs)
        assert encoded.item() == blocks, f"{what}: {encoded.item()} encodings of {blocks} vision blocks"
        # transformers runs Qwen3.5's Gated DeltaNet in float32 (as patch_equals_one_process says):
        # relative 1e-4, and an absolute floor at float32's rounding for gradients that are
        # small themselves (measured: dt_bias, |reference| 1.2e-4, differs by 1.6e-8).
        loss_rtol, grad_rtol, grad_atol = (5e-9, 1e-4, 1e-7) if name == "qwen3_5" else (1e-12, 1e-9, 1e-15)
        assert abs(out.loss.item() - want.item()) <= loss_rtol * abs(want.item()), \
            f"{what}: loss {out.loss.item()!r} != {want.item()!r}"
        assert_gradients_equal(model, reference, what, grad_rtol, grad_atol)


def patch_processor_video_equals_one_process(rank, world, ring, ulysses, model_dir, clip):
    """As a user would: transformers' own processor (a tiny Qwen3-VL directory) given a
    conversation with a video file, its batch (`apply_chat_template(..., return_tensors="pt")`:
    the template's <|vision_start|> / <|vision_end|> left around the video's timestamped
    frame blocks, as transformers 5.x writes them) into a patched model = the unpatched model
    on one process: loss to 1e-12 and every gradient to 1e-9 (fp64)."""
    import copy

    from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor
    from transformers.utils import logging

    import mmsp

    logging.set_verbosity_error()
    processor = AutoProcessor.from_pretrained(model_dir)
    messages = [{"role": "user", "content": [{"type": "video", "video": clip},
                                             {"type": "text", "text": "What moves?"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "A dog."}]}]
    batch = dict(processor.apply_chat_template(messages, tokenize=True, return_dict=True, return_tensors="pt"))
    ids = batch["input_ids"][0].tolist()
    start = processor.tokenizer.convert_tokens_to_ids("<|vision_start|>")
    frames = batch["video_grid_thw"][0, 0].item()
    assert ids.count(start) == frames + 1, f"rank {rank}: expected transformers 5.x's wrapper, got {ids}"
    batch["pixel_values_videos"] = batch["pixel_values_videos"].double()
    labels = batch["input_ids"].masked_fill(batch["mm_token_type_ids"] != 0, -100)
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(model_dir), dtype=torch.float64)
    model.train()
    reference = copy.deepcopy(model)
    logits = reference(**batch).logits[0]
    keep = labels[0, 1:] != -100
    want = F.cross_entropy(logits[:-1][keep], labels[0, 1:][keep])
    want.backward()
    mmsp.patch(model, mmsp.Mesh(dp=world // (ring * ulysses), ring=ring, ulysses=ulysses))
    out = model(**batch, labels=labels)
    out.loss.backward()
    what = f"qwen3_vl, the processor's video batch, ring {ring} x ulysses {ulysses}, rank {rank}"
    assert abs(out.loss.item() - want.item()) <= 1e-12 * abs(want.item()), \
        f"{what}: loss {out.loss.item()!r} != {want.item()!r}"
    assert_gradients_equal(model, reference, what)


# --- reliability: the same batch, mmsp's groups and timeouts --------------------------------------

def _qwen2_vl(rank):
    import sys

    sys.path.insert(0, os.path.join(ROOT, "tests", "hf"))
    from transformers.utils import logging

    import families

    logging.set_verbosity_error()
    family = families.FAMILIES["qwen2_vl"]
    return family, families.build_model(family).train(), families.make_samples(family)


def shared_batch_differences_named_on_every_rank(rank, world):
    """batch="shared": a rank given another batch — of the same shape (other tokens; one pixel),
    of another shape, of another dtype — or a model patched with another placement, is a
    ValueError on every rank naming that rank and what differs, before the step's
    collectives; the ranks are still in step after it (the same batch then trains)."""
    import copy

    import mmsp

    family, model, samples = _qwen2_vl(rank)
    mesh = mmsp.Mesh(ring=world, timeout=timedelta(seconds=60))
    reference = copy.deepcopy(model)
    mmsp.patch(model, mesh)
    good = hf_batch(family, samples)

    def other_tokens(b):  # a different batch of the same shape: one text token (and its label)
        b["input_ids"][0, 2] += 1
        b["labels"][0, 2] = b["input_ids"][0, 2]

    def one_pixel(b):
        b["pixel_values"][5, 7] += 1e-12

    def other_shape(b):  # the first sample only
        n = len(samples[0].input_ids)
        for key in ("input_ids", "attention_mask", "labels", "mm_token_type_ids"):
            b[key] = b[key][:1, :n]
        b["pixel_values"] = b["pixel_values"][:samples[0].images[0].pixels.shape[0]]
        b["image_grid_thw"] = b["image_grid_thw"][:1]

    def other_dtype(b):
        b["pixel_values"] = b["pixel_values"].float()

    cases = [  # (the rank given another batch, its change, the parts named)
        (world - 1, other_tokens, "(input_ids, labels)"),
        (0, one_pixel, "(pixel_values)"),
        (1, other_shape, "(input_ids, attention_mask, labels, pixel_values, image_grid_thw)"),
        (world - 1, other_dtype, "(pixel_values)"),
    ]
    for odd, change, parts in cases:
        batch = {k: v.clone() for k, v in good.items()}
        if rank == odd:
            change(batch)
        try:
            model(**batch)
            raise AssertionError(f"rank {rank}: rank {odd}'s other batch ({change.__name__}) was accepted")
        except ValueError as e:
            reference_rank = 1 if odd == 0 else 0
            assert f"mmsp.patch (batch='shared'): rank {odd}'s batch differs from rank {reference_rank}'s {parts}" \
                in str(e), f"rank {rank}, {change.__name__}: {e}"
    # A model patched with another placement on one rank plans another step: named too.
    other = copy.deepcopy(reference)
    mmsp.patch(other, mesh, placement="adaptive" if rank == 1 else "zigzag")
    try:
        other(**good)
        raise AssertionError(f"rank {rank}: a model patched with another placement on rank 1 was accepted")
    except ValueError as e:
        assert "rank 1's batch differs from rank 0's (patch options)" in str(e), f"rank {rank}: {e}"
    # Still in step: the same batch trains, equal to one process.
    loss = model(**good).loss
    loss.backward()
    want = families_reference_loss(reference, family, samples)
    want.backward()
    assert abs(loss.item() - want.item()) <= 1e-12 * abs(want.item()), (loss.item(), want.item())
    assert_gradients_equal(model, reference, f"rank {rank} after the refusals")


def families_reference_loss(model, family, samples):
    import families

    return families.reference_loss(model, family, samples)


def meshes_that_differ_named_on_every_rank(rank, world):
    """Every rank constructs mmsp.Mesh, one of them with other arguments (the ring and Ulysses
    swapped; a mesh of another size; another timeout): a ValueError on every rank naming the
    argument and the ranks, before any subgroup; the ranks are still in step after it."""
    import mmsp

    assert world == 3
    for odd, theirs, want in [
        (1, dict(ulysses=3), "ring is 3 on ranks 0 and 2 but 1 on rank 1; ulysses is 1 on ranks 0 and 2 but 3 on "
                             "rank 1"),
        (0, dict(ring=4), "ring is 4 on rank 0 but 3 on ranks 1 and 2."),
        (2, dict(ring=3, timeout=timedelta(seconds=30)), "timeout is 60.0 on ranks 0 and 1 but 30.0 on rank 2."),
    ]:
        args = theirs if rank == odd else dict(ring=world)
        args.setdefault("timeout", timedelta(seconds=60))
        try:
            mmsp.Mesh(**args)
            raise AssertionError(f"rank {rank}: rank {odd}'s Mesh({theirs}) was accepted")
        except ValueError as e:
            assert "mmsp.Mesh: the ranks asked for different meshes: " in str(e) and want in str(e), \
                f"rank {rank}: {e}"
            assert "stopped before the first" in str(e), str(e)
    mesh = mmsp.Mesh(ring=world, timeout=timedelta(seconds=60))  # still in step
    x = torch.ones(3, dtype=torch.float64)
    mmsp._extension.C.all_reduce_(x, mesh.world)
    assert x.tolist() == [world] * 3


def stopped_peer_named_within_the_timeout(rank, world, stop_at, out):
    """dp = world (no context group: the world sums are the step's only collectives), the
    Mesh's timeout 3 s against the default group's 600 s. The last rank stops itself
    (SIGSTOP) before constructing its Mesh, before the forward or before the backward; rank 0
    must end within the mesh's timeout (+ slack) with mmsp's message naming the group or the
    rank; it then ends the stopped rank."""
    import signal
    import time

    import mmsp

    family, model, samples = _qwen2_vl(rank)
    pid_file = out + ".pid"
    if rank == world - 1:
        with open(pid_file + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(pid_file + ".tmp", pid_file)
    dist.barrier()
    if stop_at == "mesh":  # the stopped rank never constructs its Mesh
        if rank == world - 1:
            os.kill(os.getpid(), signal.SIGSTOP)
        if rank == 0:
            start = time.monotonic()
            try:
                mmsp.Mesh(dp=world, timeout=timedelta(seconds=3))
                message = None
            except ValueError as e:
                message = f"{type(e).__name__}: {e}"
            _end_stopped_peer(pid_file, out, time.monotonic() - start, message)
        return
    mesh = mmsp.Mesh(dp=world, timeout=timedelta(seconds=3))
    mmsp.patch(model, mesh)
    batch = hf_batch(family, samples)
    dist.barrier()
    if rank == world - 1:
        if stop_at == "forward":
            os.kill(os.getpid(), signal.SIGSTOP)
        loss = model(**batch).loss
        os.kill(os.getpid(), signal.SIGSTOP)
        loss.backward()
        raise AssertionError("the stopped rank ran on")
    if rank != 0:
        return
    loss = model(**batch).loss if stop_at == "backward" else None
    start = time.monotonic()
    try:
        if loss is None:
            model(**batch)
        else:
            loss.backward()
        message = None
    except (ValueError, RuntimeError) as e:
        message = f"{type(e).__name__}: {e}"
    _end_stopped_peer(pid_file, out, time.monotonic() - start, message)


def _end_stopped_peer(pid_file, out, elapsed, message):
    import signal

    with open(pid_file) as f:
        os.kill(int(f.read()), signal.SIGKILL)
    with open(out, "w") as f:
        json.dump({"elapsed": elapsed, "message": message}, f)


def patch_moe_equals_one_process(rank, world, family_names, ring, ulysses, runs):
    """Mixture-of-experts models (Qwen3-VL-MoE, Qwen3.5-MoE; the auxiliary loss on) patched by
    mmsp on ring x ulysses, for each (expert degree, FSDP2) of `runs`: the loss and every
    gradient equal transformers' unpatched model on one process (whose auxiliary loss sums in
    float32: loss to 5e-9, gradients to 1e-6 — Qwen3.5-MoE's to 1e-4, its Gated DeltaNet rule
    in float32), and equal the first run (no expert parallelism, no FSDP2) to 1e-9: expert
    parallelism and sharding change nothing but where the experts run."""
    import copy
    import sys

    sys.path.insert(0, os.path.join(ROOT, "tests", "hf"))
    from transformers.utils import logging

    import families
    import mmsp

    logging.set_verbosity_error()
    for name in family_names:
        family = families.FAMILIES[name]
        model = families.build_model(family).train()
        samples = families.make_samples(family)
        reference = copy.deepcopy(model)
        want = families.reference_loss(reference, family, samples)
        want.backward()
        first = None
        for expert, fsdp in runs:
            patched = copy.deepcopy(model)
            mesh = mmsp.Mesh(dp=world // (ring * ulysses), ring=ring, ulysses=ulysses, expert=expert)
            mmsp.patch(patched, mesh)
            if fsdp:
                mmsp.fully_shard(patched, mesh)
            loss = patched(**hf_batch(family, samples)).loss
            loss.backward()
            what = f"{name} on ring {ring} x ulysses {ulysses}, expert {expert}, FSDP2 {fsdp}, rank {rank}"
            assert abs(loss.item() - want.item()) <= 5e-9 * abs(want.item()), \
                f"{what}: loss {loss.item()!r} != {want.item()!r}"
            assert_gradients_equal(patched, reference, what + " (vs transformers)",
                                   1e-4 if name == "qwen3_5_moe" else 1e-6)
            if first is None:
                first = (patched, loss.item())
                continue
            assert abs(loss.item() - first[1]) <= 1e-12 * abs(first[1]), f"{what}: loss {loss.item()!r} != {first[1]!r}"
            assert_gradients_equal(patched, first[0], what + " (vs the first run)")
