"""mmsp's pixels from an image file against the image processor transformers picks for
the model (AutoImageProcessor on the model directory's preprocessor_config.json; without
torchvision, its PIL backend), on the same files, for every family: images that must be
shrunk and enlarged, extreme aspect ratios, Qwen's min/max pixels and merge-size
rounding, LLaVA's shortest-edge resize and centre crop, InternVL's tiles and thumbnail.

mmsp resizes with PIL's own bicubic arithmetic, in Pillow 13's pass order
(model/image_resize.h), so every 8-bit value is the processor's: the bound is float32's
rounding of the normalisation (1e-5 in 0..1 units), far below one level (1/255 = 3.9e-3).
Measured 2026-11-27 (transformers 5.17.0, Pillow 13.0.0): every value equal. With
stb_image_resize (mmsp before) the worst was 4/255, with PIL's pass order fixed to
horizontal-first 2/255.
"""
import json
import os
import subprocess

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

import families as F
import processors as P

# (width, height) of the test images
SIZES = [(120, 90), (57, 200), (300, 301), (40, 40), (113, 61), (17, 250), (640, 33), (56, 56), (1, 1), (3, 500)]
FAMILY_NAMES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "llava", "internvl"]
BOUND = 1e-5


def _auto_image_processor(model_dir):
    # transformers 5.17's top-level AutoImageProcessor is a placeholder that demands
    # torchvision; the class itself resolves the PIL backend when torchvision is absent.
    from transformers.models.auto.image_processing_auto import AutoImageProcessor

    return AutoImageProcessor.from_pretrained(model_dir)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_pixels_equal_the_image_processor(name, tmp_path, mmsp_bin):
    family = F.FAMILIES[name]
    cfg = F.config_dict(family)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(cfg))
    pre = P.write_preprocessor(str(model_dir), name, cfg)
    processor = _auto_image_processor(str(model_dir))
    v = cfg["vision_config"]

    lines, expected = [], []
    for i, (w, h) in enumerate(SIZES):
        path = tmp_path / f"img{i}.png"
        Image.fromarray(P.smooth_image(w, h, seed=i)).save(path)
        out = processor(images=[Image.open(path)], return_tensors="pt")
        pixels = out["pixel_values"]
        if family.kind == "qwen":
            grid = out["image_grid_thw"][0].tolist()
            rows = grid[0] * grid[1] * grid[2] // v["spatial_merge_size"] ** 2
        elif family.kind == "llava":
            pixels = pixels[0]
            side = v["image_size"] // v["patch_size"]
            grid, rows = [1, side, side], cfg["image_seq_length"]
        else:
            side = v["image_size"][0] // v["patch_size"][0]
            grid, rows = [pixels.shape[0], side, side], pixels.shape[0] * cfg["image_seq_length"]
        block = [family.image_token] * rows
        if family.start_token >= 0:
            block = [family.start_token, *block, family.end_token]
        lines.append({"input_ids": [1, *block, 2], "images": [{"path": path.name}], "image_grid_thw": [grid]})
        expected.append(pixels.to(torch.float64))
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(line) + "\n" for line in lines))

    out_file = tmp_path / "pixels.safetensors"
    r = subprocess.run([mmsp_bin, "pixels", "--model", str(model_dir / "config.json"), "--data", str(data),
                        "--out", str(out_file)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = load_file(str(out_file))

    std = torch.tensor(pre["image_std"], dtype=torch.float64)
    worst, equal, total = 0.0, 0, 0
    for i, ref in enumerate(expected):
        mine = got[f"sample{i}.image0"].to(torch.float64)
        assert mine.shape == ref.shape, f"{SIZES[i]}: mmsp {tuple(mine.shape)} vs processor {tuple(ref.shape)}"
        # back to 0..1 units: the normalisation divided each channel by its std
        if family.kind == "qwen":
            diff = (mine - ref).abs().reshape(mine.shape[0], 3, -1) * std.view(1, 3, 1)
        else:
            diff = (mine - ref).abs() * std.view(*([1] * (mine.dim() - 3)), 3, 1, 1)
        worst = max(worst, diff.max().item())
        equal += int((diff < 1e-5).sum())
        total += diff.numel()
        assert diff.max().item() <= BOUND, f"{name} image {SIZES[i]}: off by {diff.max().item() * 255:.3f}/255"
    print(f"{name}: {len(SIZES)} images, worst {worst * 255:.4f}/255, {100.0 * equal / total:.1f}% of values equal")
