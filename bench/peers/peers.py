"""The peers benchmark: one model, one batch, one CPU mesh, the ways a user would train it.

    make peers        (or: .venv/bin/python bench/peers/peers.py --build build [--ranks 4] [--tokens 4096] \
        [--width 256] [--layers 4] [--steps 3] [--out result.json])

  (a) transformers on one process (each sequence through the unpatched model);
  (b) transformers + DeepSpeed's Ulysses (UlyssesSPAttentionHF) on --ranks processes, where
      deepspeed imports (`make peers` installs it: requirements/peers.txt); (g) the same
      under ZeRO-3 (deepspeed.initialize), its training state counted;
  (c) transformers patched by mmsp.patch on --ranks processes (ring 2 x ulysses ranks/2);
  (d) `mmsp train` on the same mesh, from the same weights and data;
  (e) (c) sharded with FSDP2 (fully_shard per vision block and decoder layer, then the root,
      over the --ranks processes: mmsp.Mesh.fsdp_mesh());
  (f) transformers + FSDP2 without sequence parallelism (whole sequences on each rank).
(c), (e), (f) also count each rank's training state after one AdamW step (weights, gradients,
moments: the local parts of its tensors) and the bytes autograd saves for the backward in the
forward (the activations, weights excluded).
Each setup runs in processes of its own (peak memory is each process's ru_maxrss, the
libraries' resident pages included: see "baseline"), on a Qwen2-VL-architecture model of
--width and --layers (transformers writes it, random, float32) and two sequences of
--tokens / 2 tokens, each with one image. Step time: the median of --steps steps after one
warm-up step, the slowest rank's. Bytes: what a rank sends per step.
"""
import argparse
import contextlib
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "hf"))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))

import torch  # noqa: E402

import families  # noqa: E402  (tests/hf: transformers' models and mmsp's data files)


def config_for(width, layers):
    cfg = families.config_dict(families.FAMILIES["qwen2_vl"])
    cfg.update({"hidden_size": width, "intermediate_size": 2 * width, "num_hidden_layers": layers,
                "num_attention_heads": 4, "num_key_value_heads": 2})
    cfg["vision_config"]["hidden_size"] = width  # Qwen2-VL's merger writes the decoder's width
    half = width // 4 // 2  # rotary frequencies per head: t, h, w share them as Qwen2-VL's 16, 24, 24 of 64
    t = half // 4
    cfg["rope_scaling"] = {"type": "mrope", "mrope_section": [t, (half - t) // 2, half - t - (half - t) // 2]}
    return cfg


def samples_for(cfg, tokens):
    """Two sequences of tokens / 2: text, an image of 8 x 8 patches (16 rows), text."""
    family = families.FAMILIES["qwen2_vl"]
    gen = torch.Generator().manual_seed(3)
    out = []
    for _ in range(2):
        img = families.make_image(family, cfg, (8, 8), gen)
        block = [family.start_token] + [family.image_token] * img.placeholders + [family.end_token]
        text = tokens // 2 - len(block) - 2
        words = torch.randint(*families.TEXT_RANGE, (text,), generator=gen).tolist()
        ids = [1] + words[: text // 2] + block + words[text // 2:] + [2]
        mask = [0] + [1] * (text // 2) + [0] * len(block) + [1] * (text - text // 2) + [1]
        out.append(families.Sample(ids, mask, [img]))
    return out


def grad_norm(model):
    """The gradient's 2-norm over every parameter (float64): rows that compute the same
    step agree on it to rounding, a check that the gradients, not only the loss, are equal."""
    return math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in model.parameters() if p.grad is not None))


def _local(t):
    """The part of a tensor this rank holds: a DTensor's (FSDP2's shard) local tensor."""
    return t.to_local() if hasattr(t, "to_local") else t


def state_bytes(model, optimizer):
    """The training state this rank holds, counted from its tensors: the weights, their
    gradients and the optimizer's state (AdamW: two moments a weight), each its local part."""
    weights = sum(_local(p).numel() * p.element_size() for p in model.parameters())
    grads = sum(_local(p.grad).numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    moments = sum(_local(v).numel() * v.element_size() for st in optimizer.state.values() for v in st.values()
                  if torch.is_tensor(v) and v.dim() > 0)
    return {"weights": weights, "gradients": grads, "optimizer": moments, "total": weights + grads + moments}


class SavedActivations:
    """The bytes autograd saves for the backward during a forward (what activation memory is),
    counted once per storage, weights excluded: a tensor sharing a storage with one of the
    model's parameters at that moment (views such as W.t() included; under FSDP2 the
    gathered weights of the running layer). Costs a scan of the parameters per saved tensor:
    used on the untimed warm-up step."""

    def __init__(self, model):
        self.model, self.bytes, self._seen = model, 0, set()

    def __enter__(self):
        def pack(t):
            ptr = t.untyped_storage().data_ptr()
            weights = {_local(p).untyped_storage().data_ptr() for p in self.model.parameters()}
            if ptr not in self._seen and ptr not in weights:
                self._seen.add(ptr)
                self.bytes += t.untyped_storage().nbytes()
            return t

        self._hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)


def peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def build(root, width, layers, tokens):
    from transformers import AutoConfig, AutoModelForImageTextToText

    cfg = config_for(width, layers)
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(AutoConfig.for_model(**cfg), dtype=torch.float32)
    model_dir = os.path.join(root, "model")
    model.save_pretrained(model_dir)
    samples = samples_for(cfg, tokens)
    data = families.write_jsonl(samples, os.path.join(root, "data"))
    return model_dir, data, samples


def load(model_dir):
    from transformers import AutoModelForImageTextToText
    from transformers.utils import logging

    logging.set_verbosity_error()
    return AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).train()


def one_process(model_dir, samples, steps, out):
    model = load(model_dir)
    baseline = peak_rss_bytes()
    times, loss = [], None
    for step in range(steps + 1):
        model.zero_grad(set_to_none=True)
        t = time.perf_counter()
        loss = families.reference_loss(model, families.FAMILIES["qwen2_vl"], samples)
        loss.backward()
        if step:
            times.append(time.perf_counter() - t)
    json.dump({"step_seconds": statistics.median(times), "peak_rss_bytes": [peak_rss_bytes()],
               "baseline_rss_bytes": [baseline], "sent_bytes_per_rank": [0], "loss": loss.item(),
               "grad_norm": grad_norm(model)}, open(out, "w"))


def patched_rank(rank, world, model_dir, samples, steps, out, fsdp=False):
    """(c) transformers + mmsp.patch on ring 2 x Ulysses P/2; with fsdp, (e): the same,
    sharded with FSDP2 over the 4 ranks (each vision block, decoder layer, the root)."""
    import torch.distributed as dist

    import mmsp
    import sp_checks

    # As torchrun (OMP_NUM_THREADS=1 for several processes a node) and mmsp train's thread
    # policy do: the ranks share the cores instead of each taking all of them.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    model = load(model_dir)
    baseline = peak_rss_bytes()
    mesh = mmsp.Mesh(ring=2, ulysses=world // 2)
    mmsp.patch(model, mesh)
    n_params = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())  # ZeRO-3 empties p itself
    if fsdp:
        mmsp.fully_shard(model, mesh)
    batch = sp_checks.hf_batch(families.FAMILIES["qwen2_vl"], samples)
    groups = [g for g in (mesh.ring, mesh.ulysses, mesh.context) if g is not None]
    times, loss, sent, saved = [], None, 0, None
    for step in range(steps + 1):
        model.zero_grad(set_to_none=True)
        for g in groups:
            g.reset_bytes()
        dist.barrier()
        t = time.perf_counter()
        with SavedActivations(model) if step == 0 else contextlib.nullcontext() as counted:
            loss = model(**batch).loss
        saved = counted or saved
        loss.backward()
        dist.barrier()
        if step:
            times.append(time.perf_counter() - t)
        sent = sum(g.bytes_sent() for g in groups)
    peak = peak_rss_bytes()
    norm = grad_norm_whole(model)
    state = optimizer_state(model)
    # The gradient sum: Gloo's ring all-reduce sends 2 (P - 1) / P of the gradients (float32);
    # FSDP2 per step: an all-gather of the weights in the forward and again in the backward
    # (reshard after forward), a reduce-scatter of the gradients: each (P - 1) / P of them.
    grad_bytes = int((3 if fsdp else 2) * (world - 1) / world * n_params * 4)
    result = {"rank": rank, "step_seconds": statistics.median(times), "peak_rss_bytes": peak,
              "baseline_rss_bytes": baseline, "sent_bytes": sent + grad_bytes, "sp_bytes": sent,
              "gradient_bytes": grad_bytes, "loss": loss.item(), "grad_norm": norm, "state_bytes": state,
              "saved_activation_bytes": saved.bytes}
    with open(f"{out}.{rank}", "w") as f:
        json.dump(result, f)


def patched_fsdp_rank(rank, world, model_dir, samples, steps, out):
    patched_rank(rank, world, model_dir, samples, steps, out, fsdp=True)


def fsdp_rank(rank, world, model_dir, samples, steps, out):
    """(f) transformers + FSDP2, no sequence parallelism: each rank runs whole sequences (rank
    r the batch's sequence r mod 2, each sequence on P/2 ranks, its loss weighted 2/P, so
    the summed gradient is the step's), sharded over the P ranks as (e) is."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    model = load(model_dir)
    baseline = peak_rss_bytes()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
    n_params = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())  # ZeRO-3 empties p itself
    layers = set(model._no_split_modules)  # as accelerate's FSDP2 plugin wraps: transformers' layer classes
    for m in reversed([m for m in model.modules() if type(m).__name__ in layers]):
        fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for m in model.modules():  # each rank's loss is its part of the step's mean: sum, not average
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)
    family = families.FAMILIES["qwen2_vl"]
    mine = [samples[rank % len(samples)]]
    n_targets = sum(sum(s.loss_mask[1:]) for s in samples)
    times, loss, saved = [], None, None
    for step in range(steps + 1):
        model.zero_grad(set_to_none=True)
        dist.barrier()
        t = time.perf_counter()
        with SavedActivations(model) if step == 0 else contextlib.nullcontext() as counted:
            # reference_loss: the mean over this rank's targets
            local = families.reference_loss(model, family, mine) * sum(mine[0].loss_mask[1:])
        saved = counted or saved
        (local * len(samples) / world / n_targets).backward()
        total = local.detach().clone()
        dist.all_reduce(total)
        dist.barrier()
        if step:
            times.append(time.perf_counter() - t)
        loss = total.item() * len(samples) / world / n_targets
    peak = peak_rss_bytes()
    norm = grad_norm_whole(model)
    state = optimizer_state(model)
    grad_bytes = int(3 * (world - 1) / world * n_params * 4)
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"rank": rank, "step_seconds": statistics.median(times), "peak_rss_bytes": peak,
                   "baseline_rss_bytes": baseline, "sent_bytes": grad_bytes, "sp_bytes": 0,
                   "gradient_bytes": grad_bytes, "loss": loss, "grad_norm": norm, "state_bytes": state,
                   "saved_activation_bytes": saved.bytes}, f)


def grad_norm_whole(model):
    """grad_norm over the whole gradients: FSDP2's shards gathered (collective: every rank)."""
    sq = sum(float(_local(p.grad).double().pow(2).sum()) for p in model.parameters() if p.grad is not None)
    if any(hasattr(p, "to_local") for p in model.parameters()):
        import torch.distributed as dist

        t = torch.tensor([sq], dtype=torch.float64)
        dist.all_reduce(t)
        sq = t.item()
    return math.sqrt(sq)


def optimizer_state(model):
    """One AdamW step after the timed steps (outside the time and the peak): the training
    state a rank then holds."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    optimizer.step()
    return state_bytes(model, optimizer)


class _SentBytes:
    """What this rank hands to torch.distributed's all-to-all and all-gather (DeepSpeed's
    exchanges go through them): an all-to-all of n bytes sends n (P - 1) / P, an all-gather
    of n bytes sends n to each of the P - 1 others."""

    def __init__(self, dist, world):
        self.count, self.world = 0, world
        a2a, gather = dist.all_to_all_single, dist.all_gather

        def all_to_all_single(output, input, *args, **kwargs):
            self.count += input.numel() * input.element_size() * (world - 1) // world
            return a2a(output, input, *args, **kwargs)

        def all_gather(tensor_list, tensor, *args, **kwargs):
            self.count += tensor.numel() * tensor.element_size() * (world - 1)
            return gather(tensor_list, tensor, *args, **kwargs)

        dist.all_to_all_single, dist.all_gather = all_to_all_single, all_gather


def deepspeed_rank(rank, world, model_dir, samples, steps, out, zero3=False):
    """DeepSpeed's Ulysses for transformers (ALST: UlyssesSPAttentionHF, which replaces the
    model's attention function), the way its docs use it, on a VLM. What DeepSpeed leaves to
    the user is written here as a user would: it splits the decoder's sequence only, so every
    rank runs the vision tower on every image (no Vision DP) and the whole sequence's
    embeddings and mRoPE positions before taking its contiguous slice; the vision tower's
    own attention must bypass the replaced function; the loss is summed over the slices.
    zero3: (g) the same under ZeRO-3 (deepspeed.initialize with its sequence-parallel mpu:
    parameters, gradients and AdamW state partitioned over the ranks), whose reduction
    averages, so each rank's loss is scaled by the ranks to make the step's sum."""
    import contextlib

    import deepspeed
    import torch.distributed as dist
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    import sp_checks

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    model = load(model_dir)
    baseline = peak_rss_bytes()
    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
    mpu = UlyssesSPAttentionHF.register_with_transformers(model, "sdpa", world, micro_batch_size=len(samples),
                                                          seq_length_is_variable=True)
    ulysses_sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
    engine = None
    if zero3:
        os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                           "LOCAL_WORLD_SIZE": str(world)})
        config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3},
                  "optimizer": {"type": "AdamW", "params": {"lr": 1e-5, "torch_adam": True}},
                  "sequence_parallel_size": world}
        engine, _, _, _ = deepspeed.initialize(model=model, config=config, model_parameters=model.parameters(),
                                               mpu=mpu)

    @contextlib.contextmanager
    def whole_sequence_attention():  # the vision tower: each image whole on every rank
        ALL_ATTENTION_FUNCTIONS["sdpa"] = sdpa
        try:
            yield
        finally:
            ALL_ATTENTION_FUNCTIONS["sdpa"] = ulysses_sdpa

    family = families.FAMILIES["qwen2_vl"]
    batch = sp_checks.hf_batch(family, samples)
    ids, grid = batch["input_ids"], batch["image_grid_thw"]
    T = ids.shape[1]
    if T % world:
        raise SystemExit(f"DeepSpeed's Ulysses needs the sequence ({T}) divisible by the ranks ({world})")
    local = slice(rank * T // world, (rank + 1) * T // world)
    targets = torch.cat([batch["labels"][:, 1:], torch.full_like(ids[:, :1], -100)], dim=1)
    n_targets = int((targets != -100).sum())
    inner = model.model
    mrope, _ = inner.get_rope_index(ids, mm_token_type_ids=(ids == family.image_token).int(), image_grid_thw=grid)
    text = torch.arange(T).view(1, 1, T).expand(1, ids.shape[0], T)
    positions = torch.cat([text, mrope])[:, :, local]  # [4, B, T/P]: 1-D text positions, then t, h, w
    sent = _SentBytes(dist, world)
    n_params = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())  # ZeRO-3 empties p itself
    times, loss = [], None
    for step in range(steps + 1):
        model.zero_grad(set_to_none=True)
        sent.count = 0
        dist.barrier()
        t = time.perf_counter()
        embeds = inner.get_input_embeddings()(ids)
        with whole_sequence_attention():
            images = torch.cat(inner.get_image_features(batch["pixel_values"], grid).pooler_output)
        embeds = embeds.masked_scatter((ids == family.image_token).unsqueeze(-1).expand_as(embeds), images)
        hidden = inner.language_model(inputs_embeds=embeds[:, local], position_ids=positions,
                                      use_cache=False).last_hidden_state
        logits = model.lm_head(hidden)
        ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets[:, local].flatten(),
                                               ignore_index=-100, reduction="sum")
        if engine is not None:  # ZeRO-3 reduce-scatters the gradients, averaged over the ranks
            engine.backward(ce / n_targets * world)
        else:
            (ce / n_targets).backward()
        sp_bytes = sent.count
        if engine is None:
            for p in model.parameters():  # each rank's gradient is its slice's part: their sum is the step's
                if p.grad is not None:
                    dist.all_reduce(p.grad)
        total = ce.detach().clone()
        dist.all_reduce(total)
        dist.barrier()
        if step:
            times.append(time.perf_counter() - t)
        loss = total.item() / n_targets
        if engine is not None and step < steps:  # no optimizer step in the timed steps (as the other rows)
            engine.zero_grad()
    grad_bytes = int((3 if zero3 else 2) * (world - 1) / world * n_params * 4)
    extra = {}
    if engine is not None:
        peak = peak_rss_bytes()
        norm = zero3_grad_norm(model)
        engine.step()  # AdamW's state now exists
        extra = {"state_bytes": zero3_state_bytes(model, engine.optimizer)}
    else:
        peak, norm = peak_rss_bytes(), grad_norm(model)
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"rank": rank, "step_seconds": statistics.median(times), "peak_rss_bytes": peak,
                   "baseline_rss_bytes": baseline, "sent_bytes": sp_bytes + grad_bytes, "sp_bytes": sp_bytes,
                   "gradient_bytes": grad_bytes, "loss": loss, "grad_norm": norm, **extra}, f)


def deepspeed_zero3_rank(rank, world, model_dir, samples, steps, out):
    deepspeed_rank(rank, world, model_dir, samples, steps, out, zero3=True)


def zero3_grad_norm(model):
    """The whole gradient's norm under ZeRO-3 (each parameter's gradient gathered: collective)."""
    from deepspeed.utils import safe_get_full_grad

    return math.sqrt(sum(float(g.double().pow(2).sum()) for g in (safe_get_full_grad(p) for p in model.parameters())
                         if g is not None))


def zero3_state_bytes(model, optimizer):
    """What ZeRO-3 holds on a rank: each parameter's partition, the optimizer's fp32 copy of
    the partitions (kept even when the model is fp32), the gradients' partitions (a flat
    buffer it keeps between steps) and AdamW's moments."""
    weights = sum(p.ds_tensor.numel() * p.ds_tensor.element_size() for p in model.parameters())
    flat = getattr(optimizer, "fp32_partitioned_groups_flat", [])
    master = sum(f.numel() * f.element_size() for f in flat)
    buffer = getattr(optimizer, "grad_partitions_flat_buffer", None)  # the gradients' partitions, held throughout
    grads = buffer.numel() * buffer.element_size() if buffer is not None else \
        sum(f.grad.numel() * f.grad.element_size() for f in flat if f.grad is not None)
    inner = getattr(optimizer, "optimizer", optimizer)
    moments = sum(v.numel() * v.element_size() for st in inner.state.values() for v in st.values()
                  if torch.is_tensor(v) and v.dim() > 0)
    return {"weights": weights + master, "gradients": grads, "optimizer": moments,
            "total": weights + master + grads + moments}


def on_ranks(rank_fn, model_dir, samples, steps, world, out, tmp):
    import sp_ranks

    os.environ.setdefault("MMSP_PACKAGE_PATH", os.path.join(os.environ["MMSP_BUILD"], "python"))
    sp_ranks.run(world, rank_fn, model_dir, samples, steps, out, tmp_path=tmp)
    ranks = [json.load(open(f"{out}.{r}")) for r in range(world)]
    json.dump({"step_seconds": max(r["step_seconds"] for r in ranks),
               "peak_rss_bytes": [r["peak_rss_bytes"] for r in ranks],
               "baseline_rss_bytes": [r["baseline_rss_bytes"] for r in ranks],
               "sent_bytes_per_rank": [r["sent_bytes"] for r in ranks],
               "sequence_parallel_bytes_per_rank": [r["sp_bytes"] for r in ranks],
               "loss": ranks[0]["loss"], "grad_norm": ranks[0]["grad_norm"],
               **{k: [r[k] for r in ranks] for k in ("state_bytes", "saved_activation_bytes") if k in ranks[0]}},
              open(out, "w"))


def mmsp_train(build_dir, model_dir, data, samples, steps, world, out_dir):
    tokens = sum(len(s.input_ids) for s in samples)
    cmd = [os.path.join(build_dir, "mmsp-run"), "-n", str(world), "--", os.path.join(build_dir, "mmsp"), "train",
           "--model", model_dir, "--data", data, "--steps", str(steps + 1), "--dtype", "float32", "--no-shuffle",
           "--tokens-per-rank", str(-(-tokens // world)), "--ring", "2", "--ulysses", str(world // 2),
           "--out", out_dir, "--quiet", "--overwrite"]
    run = subprocess.run(cmd, check=True, capture_output=True, text=True)
    lines = [json.loads(l) for l in open(os.path.join(out_dir, "metrics.jsonl"))]
    return lines, [l for l in run.stdout.splitlines() if "resident" in l or "peak" in l]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.ranks < 2 or a.ranks % 2:
        sys.exit(f"--ranks {a.ranks}: the mesh is ring 2 x ulysses ranks/2; give an even number >= 2")
    os.environ["MMSP_BUILD"] = os.path.abspath(a.build)
    tmp = tempfile.mkdtemp(prefix="mmsp-peers-")
    model_dir, data, samples = build(tmp, a.width, a.layers, a.tokens)
    rows = {}
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    p = ctx.Process(target=one_process, args=(model_dir, samples, a.steps, os.path.join(tmp, "a.json")))
    p.start()
    p.join()
    rows["transformers, 1 process"] = json.load(open(os.path.join(tmp, "a.json")))
    try:
        import deepspeed  # noqa: F401
    except ImportError as e:
        rows["transformers + DeepSpeed Ulysses"] = {"skipped": f"deepspeed is not installed ({e}): make peers"}
    else:
        on_ranks(deepspeed_rank, model_dir, samples, a.steps, a.ranks, os.path.join(tmp, "b.json"), tmp)
        rows[f"transformers + DeepSpeed Ulysses, {a.ranks} ranks"] = json.load(open(os.path.join(tmp, "b.json")))
        on_ranks(deepspeed_zero3_rank, model_dir, samples, a.steps, a.ranks, os.path.join(tmp, "g.json"), tmp)
        rows[f"transformers + DeepSpeed Ulysses + ZeRO-3, {a.ranks} ranks"] = json.load(
            open(os.path.join(tmp, "g.json")))
    on_ranks(patched_rank, model_dir, samples, a.steps, a.ranks, os.path.join(tmp, "c.json"), tmp)
    rows[f"transformers + mmsp.patch, {a.ranks} ranks"] = json.load(open(os.path.join(tmp, "c.json")))
    on_ranks(patched_fsdp_rank, model_dir, samples, a.steps, a.ranks, os.path.join(tmp, "e.json"), tmp)
    rows[f"transformers + mmsp.patch + FSDP2, {a.ranks} ranks"] = json.load(open(os.path.join(tmp, "e.json")))
    on_ranks(fsdp_rank, model_dir, samples, a.steps, a.ranks, os.path.join(tmp, "f.json"), tmp)
    rows[f"transformers + FSDP2 (no SP), {a.ranks} ranks"] = json.load(open(os.path.join(tmp, "f.json")))
    unsharded = max(r["total"] for r in rows[f"transformers + mmsp.patch, {a.ranks} ranks"]["state_bytes"])
    sharded = max(r["total"] for r in rows[f"transformers + mmsp.patch + FSDP2, {a.ranks} ranks"]["state_bytes"])
    ratios = {"state_fsdp2_over_unsharded_patch": sharded / unsharded}
    for name, row in (("fsdp2_patch", "transformers + mmsp.patch + FSDP2"),
                      ("fsdp2_no_sp", "transformers + FSDP2 (no SP)")):
        ratios[f"saved_activations_{name}_over_patch"] = (
            max(rows[f"{row}, {a.ranks} ranks"]["saved_activation_bytes"]) /
            max(rows[f"transformers + mmsp.patch, {a.ranks} ranks"]["saved_activation_bytes"]))
    lines, summary = mmsp_train(a.build, model_dir, data, samples, a.steps, a.ranks, os.path.join(tmp, "d"))
    rows[f"mmsp train, {a.ranks} ranks"] = {
        "step_seconds": statistics.median(l["seconds"] for l in lines[1:]),
        "sent_bytes_per_rank": [lines[-1]["comm_bytes"]], "sequence_parallel_bytes_per_rank":
        [lines[-1]["attention_bytes"] + lines[-1]["vision_bytes"]], "peak_tensor_bytes": lines[-1]["peak_bytes"],
        "loss": lines[0]["loss"], "grad_norm": lines[0]["grad_norm"], "summary": summary, "metrics": lines[1:]}
    result = {"benchmark": "peers", "ranks": a.ranks, "tokens": sum(len(s.input_ids) for s in samples),
              "width": a.width, "layers": a.layers, "steps": a.steps, "rows": rows, "ratios": ratios,
              "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    text = json.dumps(result, indent=1)
    if a.out:
        open(a.out, "w").write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
