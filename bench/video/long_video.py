"""One long video file trained under SP: decode time, step time and peak, 4 ranks against one.

    python3 bench/video/long_video.py --build build [--frames 128] [--side 448] [--steps 3] [--out result.json]

(the Python needs torchcodec, requirements/hf.txt's, to write the clip). An .mp4 of --frames
frames of --side x --side (h264, torchcodec's encoder, smooth moving colour) is one video of
frames/2 x (side/14)^2 patches (128 x 448: 65,536 patches, 16,384 placeholder rows) in a sample
with a short text tail, for configs/tiny-qwen2-vl.json (its vocabulary cut to 1,024). Measured, in one run on this machine:

- decode: `mmsp pixels` on the line (FFmpeg decode, RGB, normalise, patch rows: what the
  encoding rank does before a step) minus `mmsp pixels` on a text-only line (start-up);
- `mmsp train`, float32, --steps steps, on one rank and on 4 (ring 2 x Ulysses 2,
  --vision-split auto: the tower split over the context group): each step's seconds, the
  busiest rank's peak and the vision routing bytes (metrics.jsonl), median over the steps
  after the first.
The ratios: 4 ranks / one rank (step time, peak), decode / step, and each with
--prefetch-pixels (the next step's video decoded on a thread during this one) / without.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "hf"))

import torch  # noqa: E402

import processors as P  # noqa: E402

# configs/tiny-qwen2-vl.json with a vocabulary of 1,024 (special ids moved into it: at 152k
# the loss's vocabulary blocks set every rank's peak alike and hide the vision part's) and 4
# vision heads (2 do not divide over 4 ranks: the video would stay whole on one rank).
START, END, VIDEO = 1000, 1001, 1004


def write_config(folder):
    with open(os.path.join(ROOT, "configs", "tiny-qwen2-vl.json")) as f:
        cfg = json.load(f)
    cfg["vision_config"]["num_heads"] = 4  # the tower splits over 4 ranks only if they divide its heads
    cfg.update(vocab_size=1024, bos_token_id=1, eos_token_id=2, vision_start_token_id=START,
               vision_end_token_id=END, vision_token_id=1002, image_token_id=1003, video_token_id=VIDEO)
    path = os.path.join(folder, "config.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def write_clip(path, frames, side, fps=8, x264=None):
    """`x264`: the encoder's x264-params (the group of pictures), its defaults when None."""
    from torchcodec.encoders import VideoEncoder

    base = torch.from_numpy(P.smooth_image(side + frames, side, seed=1)).permute(2, 0, 1)
    clip = torch.stack([base[:, :, i:i + side] for i in range(frames)])  # the picture pans right
    VideoEncoder(clip, frame_rate=fps).to_file(str(path), extra_options={"x264-params": x264} if x264 else None)


def write_data(folder, frames, side):
    t, hw = frames // 2, side // 14
    ids = [1, START] + [VIDEO] * (t * hw * hw // 4) + [END] + [3 + k % 100 for k in range(24)] + [2]
    video = {"input_ids": ids, "videos": [{"path": "clip.mp4", "frame_indices": list(range(frames))}],
             "video_grid_thw": [[t, hw, hw]]}
    with open(os.path.join(folder, "long.jsonl"), "w") as f:
        f.write(json.dumps(video) + "\n")
    with open(os.path.join(folder, "text.jsonl"), "w") as f:
        f.write(json.dumps({"input_ids": [1] + [3 + k % 100 for k in range(24)] + [2]}) + "\n")
    return len(ids), t * hw * hw


def timed(cmd, cwd):
    start = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return time.perf_counter() - start


def train(build, folder, name, ranks, tokens_per_rank, steps, prefetch=False):
    out = os.path.join(folder, name)
    cmd = [os.path.join(build, "mmsp"), "train", "--model", os.path.join(folder, "config.json"), "--data", "long.jsonl", "--dtype", "float32",
           "--steps", str(steps), "--tokens-per-rank", str(tokens_per_rank), "--out", out]
    if prefetch:
        cmd.append("--prefetch-pixels")
    if ranks > 1:
        cmd = [os.path.join(build, "mmsp-run"), "-n", str(ranks), "--"] + cmd + [
            "--ring", "2", "--ulysses", str(ranks // 2), "--vision-split", "auto"]
    timed(cmd, folder)
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    later = rows[1:] or rows
    return {"step_seconds": statistics.median(r["seconds"] for r in later),
            "vision_seconds": statistics.median(r["vision_s"] for r in later),
            "peak_bytes": max(r["peak_bytes"] for r in later),
            "vision_bytes": later[-1]["vision_bytes"], "comm_bytes": later[-1]["comm_bytes"],
            "loss": [r["loss"] for r in rows]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--frames", type=int, default=128)
    ap.add_argument("--side", type=int, default=448)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.side % 28 or args.frames % 2:
        ap.error("--side must be a multiple of 28 (patch 14 x merge 2) and --frames even")
    build = os.path.abspath(args.build)
    with tempfile.TemporaryDirectory() as folder:
        write_clip(os.path.join(folder, "clip.mp4"), args.frames, args.side)
        tokens, patches = write_data(folder, args.frames, args.side)
        config = write_config(folder)
        pixels = [os.path.join(build, "mmsp"), "pixels", "--model", config, "--out", "px.safetensors", "--data"]
        startup = min(timed(pixels + ["text.jsonl"], folder) for _ in range(2))
        decode = min(timed(pixels + ["long.jsonl"], folder) for _ in range(2)) - startup
        per_rank = -(-tokens // 4 // 64) * 64 + 64
        one = train(build, folder, "one", 1, 4 * per_rank, args.steps)
        four = train(build, folder, "four", 4, per_rank, args.steps)
        one_prefetch = train(build, folder, "one-prefetch", 1, 4 * per_rank, args.steps, prefetch=True)
        four_prefetch = train(build, folder, "four-prefetch", 4, per_rank, args.steps, prefetch=True)
    result = {"frames": args.frames, "side": args.side, "patches": patches, "tokens": tokens,
              "decode_seconds": decode, "one_rank": one, "four_ranks": four,
              "one_rank_prefetch": one_prefetch, "four_ranks_prefetch": four_prefetch,
              "prefetch_step_ratio_one_rank": one_prefetch["step_seconds"] / one["step_seconds"],
              "prefetch_step_ratio_four_ranks": four_prefetch["step_seconds"] / four["step_seconds"],
              "step_ratio": four["step_seconds"] / one["step_seconds"],
              "peak_ratio": four["peak_bytes"] / one["peak_bytes"],
              "decode_to_step_four_ranks": decode / four["step_seconds"],
              "torch": torch.__version__, "cpus": os.cpu_count()}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
