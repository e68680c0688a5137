"""The peers benchmark: one model, one batch, one CPU mesh, the ways a user would train it.

    .venv/bin/python bench/peers/peers.py --build build [--ranks 4] [--tokens 4096] \
        [--width 256] [--layers 4] [--steps 3] [--out result.json]

  (a) transformers on one process (each sequence through the unpatched model);
  (b) transformers + DeepSpeed's Ulysses (deepspeed.sequence.layer.DistributedAttention),
      measured only where deepspeed imports (it is not in requirements: PyPI has no wheel of
      it for this torch, only a source package);
  (c) transformers patched by mmsp.patch on --ranks processes (ring 2 x ulysses ranks/2);
  (d) `mmsp train` on the same mesh, from the same weights and data.
Each setup runs in processes of its own (peak memory is each process's ru_maxrss, the
libraries' resident pages included: see "baseline"), on a Qwen2-VL-architecture model of
--width and --layers (transformers writes it, random, float32) and two sequences of
--tokens / 2 tokens, each with one image. Step time: the median of --steps steps after one
warm-up step, the slowest rank's. Bytes: what a rank sends per step.
"""
import argparse
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
               "baseline_rss_bytes": [baseline], "sent_bytes_per_rank": [0], "loss": loss.item()}, open(out, "w"))


def patched_rank(rank, world, model_dir, samples, steps, out):
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
    batch = sp_checks.hf_batch(families.FAMILIES["qwen2_vl"], samples)
    groups = [g for g in (mesh.ring, mesh.ulysses, mesh.context) if g is not None]
    n_params = sum(p.numel() for p in model.parameters())
    times, loss, sent = [], None, 0
    for step in range(steps + 1):
        model.zero_grad(set_to_none=True)
        for g in groups:
            g.reset_bytes()
        dist.barrier()
        t = time.perf_counter()
        loss = model(**batch).loss
        loss.backward()
        dist.barrier()
        if step:
            times.append(time.perf_counter() - t)
        sent = sum(g.bytes_sent() for g in groups)
    # The gradient sum: Gloo's ring all-reduce sends 2 (P - 1) / P of the gradients (float32).
    grad_bytes = int(2 * (world - 1) / world * n_params * 4)
    result = {"rank": rank, "step_seconds": statistics.median(times), "peak_rss_bytes": peak_rss_bytes(),
              "baseline_rss_bytes": baseline, "sent_bytes": sent + grad_bytes, "sp_bytes": sent,
              "gradient_bytes": grad_bytes, "loss": loss.item()}
    with open(f"{out}.{rank}", "w") as f:
        json.dump(result, f)


def patched(model_dir, samples, steps, world, out, tmp):
    import sp_ranks

    os.environ.setdefault("MMSP_PACKAGE_PATH", os.path.join(os.environ["MMSP_BUILD"], "python"))
    sp_ranks.run(world, patched_rank, model_dir, samples, steps, out, tmp_path=tmp)
    ranks = [json.load(open(f"{out}.{r}")) for r in range(world)]
    json.dump({"step_seconds": max(r["step_seconds"] for r in ranks),
               "peak_rss_bytes": [r["peak_rss_bytes"] for r in ranks],
               "baseline_rss_bytes": [r["baseline_rss_bytes"] for r in ranks],
               "sent_bytes_per_rank": [r["sent_bytes"] for r in ranks],
               "sequence_parallel_bytes_per_rank": [r["sp_bytes"] for r in ranks],
               "loss": ranks[0]["loss"]}, open(out, "w"))


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

        rows["transformers + DeepSpeed Ulysses"] = {"skipped": "deepspeed imports, but this setup is not written yet"}
    except ImportError as e:
        rows["transformers + DeepSpeed Ulysses"] = {"skipped": f"deepspeed is not installed ({e})"}
    patched(model_dir, samples, a.steps, a.ranks, os.path.join(tmp, "c.json"), tmp)
    rows[f"transformers + mmsp.patch, {a.ranks} ranks"] = json.load(open(os.path.join(tmp, "c.json")))
    lines, summary = mmsp_train(a.build, model_dir, data, samples, a.steps, a.ranks, os.path.join(tmp, "d"))
    rows[f"mmsp train, {a.ranks} ranks"] = {
        "step_seconds": statistics.median(l["seconds"] for l in lines[1:]),
        "sent_bytes_per_rank": [lines[-1]["comm_bytes"]], "sequence_parallel_bytes_per_rank":
        [lines[-1]["attention_bytes"] + lines[-1]["vision_bytes"]], "peak_tensor_bytes": lines[-1]["peak_bytes"],
        "loss": lines[0]["loss"], "summary": summary, "metrics": lines[1:]}
    result = {"benchmark": "peers", "ranks": a.ranks, "tokens": sum(len(s.input_ids) for s in samples),
              "width": a.width, "layers": a.layers, "steps": a.steps, "rows": rows,
              "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    text = json.dumps(result, indent=1)
    if a.out:
        open(a.out, "w").write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
