"""torch.compile of a patched model: step time eager vs compiled, on the peers benchmark's model.

    .venv/bin/python bench/peers/compile.py --build build [--ranks 2] [--tokens 4096] [--width 256] \
        [--layers 4] [--steps 3] [--modes eager,aot_eager,inductor] [--rounds 1] [--out result.json]

transformers' Qwen2-VL-architecture model (peers.py's, float32) patched by mmsp.patch on ring 2 x
Ulysses ranks/2; in the compiled modes every decoder layer is torch.compile'd (Module.compile, the
mmsp ops become torch.ops.mmsp nodes: mmsp.library). Per mode, in fresh processes: the first step
(compilation included) and the median of --steps steps after it (the slowest rank's), the loss
and the gradient norm (the modes compute the same step: they must agree), and graph breaks.
--rounds N runs the modes in turn N times (fresh processes each) and keeps each mode's median
step: a machine whose load drifts then weighs on every mode alike. The attention op's backward
continues from what its forward saved (mmsp.library), so a compiled step runs the same
attention work as an eager one.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import peers  # noqa: E402  (its model, samples and rank runner)


def compiled_rank(rank, world, model_dir, samples, steps, out, mode):
    import torch.distributed as dist

    import compile_checks
    import mmsp
    import sp_checks

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    model = peers.load(model_dir)
    mesh = mmsp.Mesh(ring=2, ulysses=world // 2)
    mmsp.patch(model, mesh)
    if mode != "eager":
        for layer in compile_checks._decoder_layers(model):
            layer.compile(backend=mode, dynamic=False)
    batch = sp_checks.hf_batch(peers.families.FAMILIES["qwen2_vl"], samples)
    times, loss = [], None
    for step in range(steps + 1):
        model.zero_grad(set_to_none=True)
        dist.barrier()
        t = time.perf_counter()
        loss = model(**batch).loss
        loss.backward()
        dist.barrier()
        times.append(time.perf_counter() - t)
    breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"first_step_seconds": times[0], "step_seconds": statistics.median(times[1:]),
                   "loss": loss.item(), "grad_norm": peers.grad_norm_whole(model), "graph_breaks": breaks}, f)


def run_mode(mode, model_dir, samples, steps, world, tmp, round_):
    import sp_ranks

    # a store file of its own: a used one would stall the next ranks
    run_dir = os.path.join(tmp, f"{mode}.{round_}")
    os.makedirs(run_dir)
    out = os.path.join(run_dir, "result.json")
    sp_ranks.run(world, compiled_rank, model_dir, samples, steps, out, mode, tmp_path=run_dir)
    ranks = [json.load(open(f"{out}.{r}")) for r in range(world)]
    return {"first_step_seconds": max(r["first_step_seconds"] for r in ranks),
            "step_seconds": max(r["step_seconds"] for r in ranks), "loss": ranks[0]["loss"],
            "grad_norm": ranks[0]["grad_norm"], "graph_breaks": max(r["graph_breaks"] for r in ranks)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(peers.ROOT, "build"))
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--modes", default="eager,aot_eager,inductor")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.ranks < 2 or args.ranks % 2:
        ap.error(f"--ranks {args.ranks}: the mesh is ring 2 x Ulysses ranks/2, so give an even number >= 2")
    os.environ["MMSP_BUILD"] = os.path.abspath(args.build)
    os.environ.setdefault("MMSP_PACKAGE_PATH", os.path.join(os.environ["MMSP_BUILD"], "python"))
    sys.path.insert(0, os.environ["MMSP_PACKAGE_PATH"])
    result = {"ranks": args.ranks, "tokens": args.tokens, "width": args.width, "layers": args.layers,
              "steps": args.steps, "rounds": args.rounds, "torch": torch.__version__, "cpus": os.cpu_count(),
              "modes": {}}
    modes = args.modes.split(",")
    runs = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, _, samples = peers.build(tmp, args.width, args.layers, args.tokens)
        for round_ in range(args.rounds):
            for mode in modes:
                runs[mode].append(run_mode(mode, model_dir, samples, args.steps, args.ranks, tmp, round_))
                print(mode, round_, json.dumps(runs[mode][-1]), flush=True)
    for mode in modes:
        r = dict(runs[mode][-1])
        r["first_step_seconds"] = statistics.median(x["first_step_seconds"] for x in runs[mode])
        r["step_seconds"] = statistics.median(x["step_seconds"] for x in runs[mode])
        r["step_seconds_per_round"] = [x["step_seconds"] for x in runs[mode]]
        result["modes"][mode] = r
    eager = result["modes"].get("eager")
    if eager:
        for mode, r in result["modes"].items():
            r["step_ratio_to_eager"] = r["step_seconds"] / eager["step_seconds"]
            r["loss_relative_difference"] = abs(r["loss"] - eager["loss"]) / abs(eager["loss"])
            r["grad_norm_relative_difference"] = abs(r["grad_norm"] - eager["grad_norm"]) / eager["grad_norm"]
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
