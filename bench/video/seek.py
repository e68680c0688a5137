"""Frames of a long video file decoded by seeking to the key frame before each: time and frames.

    python3 bench/video/seek.py --build build [--frames 960] [--side 224] [--out result.json]

(the Python needs torchcodec, requirements/hf.txt's, to write the clips and as the reference.)
Two .mp4s of the same --frames frames (h264 through torchcodec's encoder, 24 fps, a picture
panning right): one with a key frame every second (24 frames, as cameras and streaming
encoders write them), one with a single key frame (x264 keyint=infinite, scenecut off), which
costs every frame before the last one asked whatever the decoder does. Three sets of frames:
2 fps over the whole clip (what Qwen's processors sample), its last quarter (one rank's share
of that video when the tower splits it over 4 ranks), and 8 frames spread over the clip (a
num_frames sampling). For each clip and set, measured in one run on this machine:

- `mmsp pixels` on a line asking for those frames: the seconds it reports making the pixels
  (the decode, RGB, resize, normalise and patch rows the encoding rank does before a step;
  not its start-up or the file it writes), min of 3, and its count of frames decoded and
  seeks (its summary line);
- torchcodec's `VideoDecoder(path).get_frames_at(indices)` (what transformers' fetch_videos
  calls; its scan included), min of 3;
- the frames a decode from the start needs (last index + 1: what mmsp decoded before it
  sought).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

from long_video import END, START, VIDEO, write_clip, write_config  # noqa: E402

CLIPS = {"key every second": "keyint=24:min-keyint=24:scenecut=0",
         "one key frame": "keyint=infinite:scenecut=0"}


def frame_sets(frames):
    two_fps = list(range(0, frames, 12))
    spread = [round(k * (frames - 1) / 7) for k in range(8)]
    return {"2 fps over the clip": two_fps, "its last quarter (a rank's share of 4)": two_fps[-len(two_fps) // 4:],
            "8 frames over the clip": spread}


def write_line(folder, clip, indices, side):
    t, hw = -(-len(indices) // 2), side // 14
    ids = [1, START] + [VIDEO] * (t * hw * hw // 4) + [END, 2]
    line = {"input_ids": ids, "videos": [{"path": clip, "frame_indices": indices}], "video_grid_thw": [[t, hw, hw]]}
    with open(os.path.join(folder, "line.jsonl"), "w") as f:
        f.write(json.dumps(line) + "\n")


def pixels(build, folder, data):
    """`mmsp pixels` on `data`: (seconds making the pixels, frames decoded, seeks)."""
    cmd = [os.path.join(build, "mmsp"), "pixels", "--model", "config.json", "--out", "px.safetensors", "--data", data]
    r = subprocess.run(cmd, cwd=folder, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    got = re.search(r"pixels made in ([\d.]+) s; video files: (\d+) frames decoded, (\d+) seeks", r.stdout)
    if not got:
        raise SystemExit(f"no counts in mmsp pixels' summary: {r.stdout}")
    return float(got[1]), int(got[2]), int(got[3])


def torchcodec_seconds(path, indices):
    from torchcodec.decoders import VideoDecoder

    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        VideoDecoder(path).get_frames_at(indices)
        best = min(best, time.perf_counter() - start)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--frames", type=int, default=960)
    ap.add_argument("--side", type=int, default=224)
    ap.add_argument("--out")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        write_config(folder)
        for clip, x264 in CLIPS.items():
            name = "gop.mp4" if "second" in clip else "one_key.mp4"
            write_clip(os.path.join(folder, name), a.frames, a.side, fps=24, x264=x264)
            for what, indices in frame_sets(a.frames).items():
                write_line(folder, name, indices, a.side)
                runs = [pixels(build, folder, "line.jsonl") for _ in range(3)]
                seconds, decoded, seeks = min(runs)
                row = {"clip": clip, "frames": what, "asked": len(indices), "first": indices[0], "last": indices[-1],
                       "mmsp_seconds": seconds, "frames_decoded": decoded, "seeks": seeks,
                       "from_start_frames": indices[-1] + 1,
                       "torchcodec_seconds": torchcodec_seconds(os.path.join(folder, name), indices)}
                rows.append(row)
                print(f"{clip:17} {what:40} asked {len(indices):3}  mmsp {seconds:6.3f} s, {decoded:4} frames decoded "
                      f"({indices[-1] + 1} from the start), {seeks:3} seeks;  torchcodec {row['torchcodec_seconds']:6.3f} s",
                      flush=True)
    result = {"frames": a.frames, "side": a.side, "fps": 24, "rows": rows,
              "torch": torch.__version__}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
