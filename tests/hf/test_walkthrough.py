"""The README's fine-tune walk-through, run as it is written, for every family: the block
between its `walkthrough` markers goes to bash in a fresh folder that holds a tiny model
directory (transformers' weights, tokenizer, chat template and processor, built here),
a conversation file with images, and `build/` and `.venv/` pointing at this build. It must
end 0, and its last line (transformers loading the trained hf/) must load every tensor."""
import json
import os
import re
import subprocess
import sys

import pytest
import torch

import families as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))  # tests/python/tiny_models.py

from PIL import Image  # noqa: E402

import processors as P  # noqa: E402
import tiny_models  # noqa: E402


def readme_block():
    with open(os.path.join(F.REPO, "README.md")) as f:
        text = f.read()
    m = re.search(r"<!-- walkthrough:[^\n]*-->\n```\n(.*?)```\n<!-- walkthrough end -->", text, re.S)
    assert m, "README.md has no walkthrough block between its markers"
    return m.group(1)


RECORDS = [
    {"conversations": [{"from": "human", "value": "<image>\nWhat is in the picture?"},
                       {"from": "gpt", "value": "A red square on a green field."}], "image": "a.png"},
    {"messages": [{"role": "user", "content": [{"type": "image", "image": "b.png"},
                                               {"type": "text", "text": "Describe it."}]},
                  {"role": "assistant", "content": "Two blue circles."},
                  {"role": "user", "content": "Which is larger?"},
                  {"role": "assistant", "content": "The left one."}]},
    {"conversations": [{"from": "human", "value": "Compare <image> and <image>."},
                       {"from": "gpt", "value": "The first is brighter."}], "images": ["a.png", "b.png"]},
]


# The README's video variant: the same block, conversations holding .mp4 files.
VIDEO_RECORDS = [
    {"messages": [{"role": "user", "content": [{"type": "video", "video": "clip.mp4"},
                                               {"type": "text", "text": "What happens?"}]},
                  {"role": "assistant", "content": "The colours drift."}]},
    {"conversations": [{"from": "human", "value": "<video>\nDescribe the clip."},
                       {"from": "gpt", "value": "Soft shapes move slowly."}], "video": "clip.mp4"},
    {"messages": [{"role": "user", "content": [{"type": "image", "image": "a.png"},
                                               {"type": "video", "video": "clip.mp4"},
                                               {"type": "text", "text": "Is the picture in the clip?"}]},
                  {"role": "assistant", "content": "No."}]},
]


def _write_clip(path):
    """A 3-second 8 fps h264 clip of smooth moving colour, written by torchcodec's encoder."""
    from torchcodec.encoders import VideoEncoder

    frames = torch.stack([torch.from_numpy(P.smooth_image(96, 64, seed=100 + i)).permute(2, 0, 1) for i in range(24)])
    VideoEncoder(frames, frame_rate=8).to_file(str(path))


# One Qwen-VL tower with images (Qwen2.5-VL), one with a video (Qwen3-VL: timestamps in the
# text), the hybrid decoder with experts (Qwen3.5-MoE), LLaVA and InternVL. Qwen2-VL's,
# Qwen3-VL's, Qwen3-VL-MoE's and Qwen3.5's image runs and Qwen2.5-VL's video were cut for CI's
# time (2026-12-02: 30-39 s each); hf.reference holds every family to transformers.
CUT = ("qwen2_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5")
CASES = [(f, "images") for f in tiny_models.FAMILIES if f not in CUT] + [("qwen3_vl", "video")]


@pytest.mark.parametrize("family,data", CASES)
def test_readme_walkthrough(family, data, tmp_path, mmsp_bin, mmsp_run):
    from transformers import AutoConfig, AutoModelForImageTextToText

    work = tmp_path
    model_dir = work / "model"
    tiny_models.build(family, str(model_dir))  # tokenizer, chat template, processor, config.json
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(str(model_dir)))
    model.save_pretrained(str(model_dir), max_shard_size="2MB")  # the weights, sharded, float32

    (work / "data").mkdir()
    for i, name in enumerate(["a.png", "b.png"]):
        Image.fromarray(P.smooth_image(90 + 20 * i, 70, seed=i)).save(work / "data" / name)
    if data == "video":
        _write_clip(work / "data" / "clip.mp4")
    (work / "data" / "train.json").write_text(json.dumps(RECORDS if data == "images" else VIDEO_RECORDS, indent=1))
    # build/ and .venv/ as in a checkout
    (work / "build").mkdir()
    os.symlink(mmsp_bin, work / "build" / "mmsp")
    os.symlink(mmsp_run, work / "build" / "mmsp-run")
    # (a script, not a link: a venv's python finds its packages from where it is called)
    (work / ".venv" / "bin").mkdir(parents=True)
    wrapper = work / ".venv" / "bin" / "python"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)

    env = dict(os.environ, MODEL=str(model_dir), HF_HUB_OFFLINE="1")
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", readme_block()], cwd=work, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert "mmsp prepare: wrote 3 samples" in r.stderr, r.stderr[-2000:]
    lines = [json.loads(l) for l in (work / "data" / "train.jsonl").read_text().splitlines()]
    assert len(lines) == 3 and all(sum(l["loss_mask"]) > 0 for l in lines)
    if data == "video":  # the processor's frames, kept for training to decode
        assert all(l["videos"][0].get("frame_indices") for l in lines), lines[0].get("videos")
    steps = [json.loads(l) for l in (work / "runs" / "ft" / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 20 and all(s["loss"] == s["loss"] for s in steps)
    print(f"{family}: loss {steps[0]['loss']:.4f} -> {steps[-1]['loss']:.4f} over 20 steps")
