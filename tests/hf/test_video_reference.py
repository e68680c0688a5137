"""A video file, end to end, against transformers itself: an .mp4 (torchcodec's encoder) in a
data line as `mmsp prepare` writes it ({"path", "frame_indices"}), trained one step by `mmsp
train` from a checkpoint transformers wrote, on 1 rank and on 4 (ring 2 x Ulysses 2, the tower
split over the context group), against transformers' forward and backward on the same tokens
with the video processor's pixel_values_videos for the frames torchcodec decodes at those
indices (the clip has a key frame every 3 frames, so each rank's share of the split video is
decoded from the key frame before it): the loss and every gradient (tolerances:
test_reference.py's, float32 inside a float64 transformers model). So the decoder, the resize, the normalisation, the rows' layout,
the positions after a video and the tower's split are all checked at once. Qwen3-VL twice:
its frame blocks inside the wrapper transformers 5.x leaves (prepare's default), whose two
markers are text, and as the released processor wrote them (`--video-wrapper drop`).
A clip damaged after prepare ends the job on every rank, naming the line, the file and the frame.
"""
import dataclasses
import json
import os
import re
import subprocess
import time

import pytest
import torch

import families as F
import processors as P
import video_bytes as V
from test_reference import GRAD_RTOL, GRAD_RTOL_DEFAULT, LOSS_RTOL, LR, _load_reference
from test_video_pixels import _line, _video_processor, _write_video

CASES = [("qwen2_5_vl", False), ("qwen3_vl", False), ("qwen3_vl", True)]  # (family, wrapped)
INDICES = [0, 3, 5, 8, 10, 11]  # 3 temporal patches
SIZE = (140, 112)  # resized by the processor; the filter graph's path of the RGB conversion


def _tokens(name, family, grid, m, wrapped=False):
    """[start, video rows, end] (Qwen2.5-VL) or per temporal patch [timestamp, start, rows, end]
    (Qwen3-VL: prepare's layout; `wrapped`: inside [start, ..., end], as transformers 5.x
    writes it), between text; and its loss mask."""
    t, h, w = grid
    pad = family.overrides["video_token_id"]
    gen = torch.Generator().manual_seed(3)
    words = lambda n: torch.randint(*F.TEXT_RANGE, (n,), generator=gen).tolist()
    ids, mask = [1] + words(6), [0] + [1] * 6
    if name in ("qwen3_vl", "qwen3_5"):
        ids, mask = ids + [family.start_token] * wrapped, mask + [0] * wrapped
        for _ in range(t):
            block = words(2) + [family.start_token] + [pad] * (h * w // (m * m)) + [family.end_token]
            ids, mask = ids + block, mask + [1, 1] + [0] * (len(block) - 2)
        ids, mask = ids + [family.end_token] * wrapped, mask + [0] * wrapped
    else:
        block = [family.start_token] + [pad] * (t * h * w // (m * m)) + [family.end_token]
        ids, mask = ids + block, mask + [0] * len(block)
    tail = words(9) + [2]
    return ids + tail, mask + [1] * len(tail)


@pytest.mark.parametrize("name,wrapped", CASES)
def test_a_video_file_trains_as_transformers_computes(name, wrapped, tmp_path, mmsp_bin, mmsp_run):
    from torchcodec.decoders import VideoDecoder

    family = F.FAMILIES[name]
    vision = dict(F.config_dict(family)["vision_config"], num_heads=4)  # heads the 4 ranks divide: the tower splits
    family = dataclasses.replace(family, overrides={**family.overrides, "vision_config": vision})
    cfg = F.config_dict(family)
    m = cfg["vision_config"]["spatial_merge_size"]
    model = F.build_model(family)
    model_dir = str(tmp_path / "model")
    F.save_model(model, model_dir)
    clip = tmp_path / "clip.mp4"
    _write_video(clip, *SIZE, seed=4, tags={"g": "4"})  # key frames every few: each share seeks to its own
    processor = _video_processor(name, P.preprocessor_config(name, cfg))
    frames = VideoDecoder(str(clip)).get_frames_at(INDICES).data
    out = processor(videos=[frames], do_sample_frames=False, return_tensors="pt")
    grid = out["video_grid_thw"][0].tolist()
    ids, mask = _tokens(name, family, grid, m, wrapped)

    # transformers: forward and backward on the sequence, the loss as mmsp defines it
    model.zero_grad()
    input_ids = torch.tensor([ids])
    kwargs = {"pixel_values_videos": out["pixel_values_videos"].double(), "video_grid_thw": out["video_grid_thw"],
              "mm_token_type_ids": 2 * (input_ids == family.overrides["video_token_id"]).int()}
    if name == "qwen2_5_vl":
        kwargs["second_per_grid_ts"] = torch.tensor([1.0])
    logits = model(input_ids=input_ids, **kwargs).logits[0]
    keep = torch.tensor(mask[1:], dtype=torch.bool)
    ref = torch.nn.functional.cross_entropy(logits[:-1][keep], input_ids[0, 1:][keep], reduction="sum") / keep.sum()
    ref.backward()

    line = {"input_ids": ids, "loss_mask": mask, "videos": [{"path": "clip.mp4", "frame_indices": INDICES}],
            "video_grid_thw": [grid]}
    if name == "qwen2_5_vl":
        line["second_per_grid_ts"] = [1.0]
    (tmp_path / "data.jsonl").write_text(json.dumps(line) + "\n")
    rtol = GRAD_RTOL.get(name, GRAD_RTOL_DEFAULT)
    # The 4-rank run splits the video's tower over the context group (mmsp plan says so).
    (tmp_path / "batch.json").write_text(json.dumps({"sequences": [{"input_ids": ids, "video_grid_thw": [grid]}]}))
    plan = subprocess.run([mmsp_bin, "plan", "--config", os.path.join(model_dir, "config.json"), "--batch",
                           str(tmp_path / "batch.json"), "--ring", "2", "--ulysses", "2", "--vision-split", "64"],
                          capture_output=True, text=True, timeout=60)
    assert "split over the context group" in plan.stdout, plan.stdout + plan.stderr
    for ranks in (1, 4):
        run, grads = str(tmp_path / f"run{ranks}"), str(tmp_path / f"grads{ranks}")
        cmd = [mmsp_bin, "train", "--model", model_dir, "--data", str(tmp_path / "data.jsonl"), "--steps", "1",
               "--dtype", "float64", "--no-shuffle", "--tokens-per-rank", str(-(-len(ids) // ranks) + 64),
               "--lr", str(LR), "--save-gradients", grads, "--out", run, "--quiet"]
        if ranks > 1:
            cmd = [mmsp_run, "-n", str(ranks), "--", *cmd, "--ring", "2", "--ulysses", "2", "--vision-split", "64"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"{' '.join(cmd)}\nexit {r.returncode}\n{r.stderr[-3000:]}"
        with open(os.path.join(run, "metrics.jsonl")) as f:
            loss = json.loads(f.readline())["loss"]
        what = f"{name} video file{' (wrapped)' if wrapped else ''} on {ranks} rank(s)"
        print(f"{what}: loss {loss!r} vs transformers {ref.item()!r}")
        assert abs(loss - ref.item()) <= LOSS_RTOL * ref.item(), f"{what}: loss {loss!r} != {ref.item()!r}"
        got, info = _load_reference(grads)
        assert not any(info.values()), f"transformers read {grads} with {info}"
        got = dict(got.named_parameters())
        want = {n: (p.grad if p.grad is not None else torch.zeros_like(p)) for n, p in model.named_parameters()}
        scale = torch.sqrt(sum(g.norm() ** 2 for g in want.values()))
        errors = {n: ((got[n] - g).norm() / max(g.norm(), 1e-6 * scale)).item() for n, g in want.items()}
        worst = max(errors, key=errors.get)
        print(f"{what}: {len(errors)} gradients, worst {worst} at {errors[worst]:.3g}")
        bad = {n: e for n, e in errors.items() if e > rtol}
        assert not bad, f"{what}: {len(bad)} gradients differ beyond {rtol:g}: {dict(list(bad.items())[:5])}"


def test_a_damaged_video_file_ends_the_job_on_every_rank(tmp_path, mmsp_bin, mmsp_run):
    """A clip whose packet is damaged after prepare (zeroed: a partial copy to one node), in
    the sample dp rank 0 of 2 trains (the longer one: packed first): rank 0's decoder refuses
    it naming the line, the file and the frame; rank 1 ends on rank 0's error, naming them
    too; mmsp-run names rank 0 (not rank 1, which ends first) and exits 2. Before, the frame
    came out concealed (or its neighbour in its place) and the job trained."""
    from torchcodec.decoders import VideoDecoder

    family = F.FAMILIES["qwen2_vl"]
    cfg = F.config_dict(family)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(cfg))  # random weights
    _write_video(tmp_path / "good.mp4", 128, 96, seed=6, tags={"g": "4"}, frames=40)
    data = (tmp_path / "good.mp4").read_bytes()
    (tmp_path / "damaged.mp4").write_bytes(V.overwrite_packet(data, V.mp4_packets(data), 34, "zero"))
    asked = [33, 34, 35]
    frames = VideoDecoder(str(tmp_path / "good.mp4")).get_frames_at(asked).data
    processor = _video_processor("qwen2_vl", P.preprocessor_config("qwen2_vl", cfg))
    grid = processor(videos=[frames], do_sample_frames=False, return_tensors="pt")["video_grid_thw"][0].tolist()
    bad = _line("qwen2_vl", family, cfg, grid, {"path": "damaged.mp4", "frame_indices": asked})
    bad["input_ids"][-1:] = [20] * 10 + [2]
    good = _line("qwen2_vl", family, cfg, grid, {"path": "good.mp4", "frame_indices": asked})
    (tmp_path / "data.jsonl").write_text(json.dumps(bad) + "\n" + json.dumps(good) + "\n")
    cmd = [mmsp_run, "-n", "2", "--", mmsp_bin, "train", "--model", str(tmp_path / "model" / "config.json"),
           "--data", str(tmp_path / "data.jsonl"), "--steps", "2", "--dp", "2", "--no-shuffle",
           "--tokens-per-rank", "64", "--out", str(tmp_path / "run")]
    start = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    seconds = time.monotonic() - start
    print(f"damaged video on dp rank 0 of 2: job over after {seconds:.1f} s, exit {r.returncode}")
    what = (r'data\.jsonl:1: video 0: video file "[^"]*/damaged\.mp4": frame 3[345] \(timestamp \d+\) cannot be '
            r'decoded: .*the file is damaged')
    assert r.returncode == 2 and seconds < 30, f"exit {r.returncode} after {seconds:.1f} s: {r.stderr[-3000:]}"
    assert re.search(r"\[rank 0\] mmsp train: error: \S*" + what, r.stderr), r.stderr[-3000:]
    assert re.search(r"\[rank 1\] mmsp(?: train)?: error: rank 0 stopped with an error: \S*" + what, r.stderr), \
        r.stderr[-3000:]
    assert "summary: rank 0 exited with status 2 (the failure" in r.stderr or \
        "summary: rank 0 exited with status 2 (first failure)" in r.stderr, r.stderr[-3000:]
    assert not os.path.exists(os.path.join(tmp_path, "run", "step-000001")), "a step was saved"
