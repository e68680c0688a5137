"""mmsp's pixels from an image file against the image processor transformers loads for
the model (AutoImageProcessor on the model directory's preprocessor_config.json, its PIL
backend asked for by name: with torchvision installed transformers 5.17 would pick the
torchvision backend), on the same files, for every family: images that must be
shrunk and enlarged, extreme aspect ratios, Qwen's min/max pixels and merge-size
rounding, LLaVA's shortest-edge resize and centre crop, InternVL's tiles and thumbnail.

mmsp resizes with PIL's own bicubic arithmetic, in Pillow 13's pass order
(model/vision/image_resize.h), so every 8-bit value is the processor's: the bound is float32's
rounding of the normalisation (1e-5 in 0..1 units), far below one level (1/255 = 3.9e-3).
Measured 2026-11-27 (transformers 5.17.0, Pillow 13.0.0): every value equal. With
stb_image_resize (mmsp before) the worst was 4/255, with PIL's pass order fixed to
horizontal-first 2/255.

The torchvision backend resizes with its own kernels; its bound against mmsp's pixels is
measured and asserted too (test_the_torchvision_backend_is_within_two_levels), so that
docs/data.md's figure stays checked.
"""
import json
import struct
import subprocess
import zlib

import numpy as np
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
# The torchvision backend against mmsp (measured 2026-11-29, torchvision 0.29.2, torch 2.15.0:
# at most 2/255 off on every family; 93.5 % of values equal for Qwen2-VL and Qwen2.5-VL,
# 97.6-98.2 % for the others): the bound asserted, with some room under the fraction.
TORCHVISION_BOUND = 2 / 255 + 1e-5
TORCHVISION_MIN_EQUAL = 0.90


def _auto_image_processor(model_dir, backend="pil"):
    # transformers 5.17 picks the torchvision backend when torchvision is installed; mmsp's
    # pixels are the PIL backend's, so that is the one named. (The top-level
    # AutoImageProcessor is a placeholder that demands torchvision; the class is not.)
    from transformers.models.auto.image_processing_auto import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(model_dir, backend=backend)
    assert type(processor).__name__.endswith("Pil") == (backend == "pil"), type(processor).__name__
    return processor


def _model(name, tmp_path, backend="pil"):
    """A model directory for family `name`: config.json, preprocessor_config.json, the processor."""
    family = F.FAMILIES[name]
    cfg = F.config_dict(family)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(cfg))
    pre = P.write_preprocessor(str(model_dir), name, cfg)
    return family, cfg, model_dir, pre, _auto_image_processor(str(model_dir), backend)


def _line(family, cfg, processor, path):
    """The .jsonl line for one image file and the processor's pixels for it (float64)."""
    v = cfg["vision_config"]
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
    return {"input_ids": [1, *block, 2], "images": [{"path": path.name}], "image_grid_thw": [grid]}, pixels.double()


def _mmsp_pixels(mmsp_bin, model_dir, tmp_path, lines):
    """`mmsp pixels` on `lines`: (return code, stderr, {name: tensor})."""
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out_file = tmp_path / "pixels.safetensors"
    r = subprocess.run([mmsp_bin, "pixels", "--model", str(model_dir / "config.json"), "--data", str(data),
                        "--out", str(out_file)], capture_output=True, text=True, timeout=120)
    return r.returncode, r.stderr, (load_file(str(out_file)) if r.returncode == 0 else {})


def _levels_off(family, pre, mine, ref):
    """|mmsp - processor| back in 0..1 units (the normalisation divided each channel by its std)."""
    std = torch.tensor(pre["image_std"], dtype=torch.float64)
    mine = mine.to(torch.float64)
    assert mine.shape == ref.shape, f"mmsp {tuple(mine.shape)} vs processor {tuple(ref.shape)}"
    if family.kind == "qwen":
        return (mine - ref).abs().reshape(mine.shape[0], 3, -1) * std.view(1, 3, 1)
    return (mine - ref).abs() * std.view(*([1] * (mine.dim() - 3)), 3, 1, 1)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_pixels_equal_the_image_processor(name, tmp_path, mmsp_bin):
    family, cfg, model_dir, pre, processor = _model(name, tmp_path)
    lines, expected = [], []
    for i, (w, h) in enumerate(SIZES):
        path = tmp_path / f"img{i}.png"
        Image.fromarray(P.smooth_image(w, h, seed=i)).save(path)
        line, pixels = _line(family, cfg, processor, path)
        lines.append(line)
        expected.append(pixels)
    worst, equal, per_image = _compare(mmsp_bin, model_dir, tmp_path, lines, family, pre, expected)
    for i, off in enumerate(per_image):
        assert off <= BOUND, f"{name} image {SIZES[i]}: off by {off * 255:.3f}/255"
    print(f"{name}: {len(SIZES)} images, worst {worst * 255:.4f}/255, {100.0 * equal:.1f}% of values equal")


def _compare(mmsp_bin, model_dir, tmp_path, lines, family, pre, expected):
    """`mmsp pixels` on `lines` against the processor's `expected`: (the worst difference, the
    fraction of values equal, each image's worst), in 0..1 units."""
    rc, err, got = _mmsp_pixels(mmsp_bin, model_dir, tmp_path, lines)
    assert rc == 0, err
    worst, equal, total, per_image = 0.0, 0, 0, []
    for i, ref in enumerate(expected):
        diff = _levels_off(family, pre, got[f"sample{i}.image0"], ref)
        per_image.append(diff.max().item())
        worst = max(worst, per_image[-1])
        equal += int((diff < 1e-5).sum())
        total += diff.numel()
    return worst, equal / total, per_image


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_the_torchvision_backend_is_within_two_levels(name, tmp_path, mmsp_bin):
    """The processor transformers picks by default when torchvision is installed: the same grids
    (so `mmsp prepare`'s tokens are the same with either backend) and pixels at most 2/255 off
    mmsp's, most of them equal: the bound docs/data.md states."""
    family, cfg, model_dir, pre, processor = _model(name, tmp_path, backend="torchvision")
    pil = _auto_image_processor(str(model_dir), "pil")
    lines, expected = [], []
    for i, (w, h) in enumerate(SIZES):
        path = tmp_path / f"img{i}.png"
        Image.fromarray(P.smooth_image(w, h, seed=i)).save(path)
        line, pixels = _line(family, cfg, processor, path)
        assert line == _line(family, cfg, pil, path)[0], f"{name} image {SIZES[i]}: the backends' grids differ"
        lines.append(line)
        expected.append(pixels)
    worst, equal, _ = _compare(mmsp_bin, model_dir, tmp_path, lines, family, pre, expected)
    print(f"{name} (torchvision backend): worst {worst * 255:.4f}/255, {100.0 * equal:.1f}% of values equal")
    assert worst <= TORCHVISION_BOUND, f"{name}: the torchvision backend is {worst * 255:.3f}/255 off mmsp's pixels"
    assert equal >= TORCHVISION_MIN_EQUAL, f"{name}: only {100.0 * equal:.1f}% of values equal"


def _png16(path, values, color_type):
    """A 16-bit PNG (PIL writes 16-bit grey only): values [H, W, C] uint16, colour type 0/2/4/6."""
    h = values.shape[0]
    raw = b"".join(b"\x00" + values[r].astype(">u2").tobytes() for r in range(h))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", values.shape[1], h, 16, color_type, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw))
                     + chunk(b"IEND", b""))


def _format_cases(rgb):
    """(file name, writer) for every mode and encoding mmsp reads; each writes `rgb` in its way."""
    image = Image.fromarray(rgb)
    alpha = np.concatenate([rgb, rgb[..., :1] // 2 + 40], axis=-1)
    wide = (rgb.astype(np.uint16) * 257 + np.arange(rgb.shape[1], dtype=np.uint16)[None, :, None] * 3)
    wide_alpha = np.concatenate([wide, wide[..., :1]], axis=-1)
    palette = image.convert("P", palette=Image.Palette.ADAPTIVE, colors=64)
    return [
        ("baseline-420.jpg", lambda p: image.save(p, quality=90)),
        ("baseline-444.jpg", lambda p: image.save(p, quality=90, subsampling=0)),
        ("baseline-422.jpg", lambda p: image.save(p, quality=90, subsampling=1)),
        ("low-quality.jpg", lambda p: image.save(p, quality=30)),
        ("progressive.jpg", lambda p: image.save(p, quality=85, progressive=True)),
        ("progressive-444.jpg", lambda p: image.save(p, quality=85, progressive=True, subsampling=0)),
        ("grey.jpg", lambda p: image.convert("L").save(p, quality=90)),
        ("grey.png", lambda p: image.convert("L").save(p)),
        ("bilevel.png", lambda p: image.convert("1").save(p)),
        ("palette.png", lambda p: palette.save(p)),
        ("palette-transparent.png", lambda p: palette.save(p, transparency=5)),
        ("rgba.png", lambda p: Image.fromarray(alpha).save(p)),
        ("grey-alpha.png", lambda p: Image.fromarray(alpha).convert("LA").save(p)),
        ("rgb16.png", lambda p: _png16(p, wide, 2)),
        ("rgba16.png", lambda p: _png16(p, wide_alpha, 6)),
        ("image.bmp", lambda p: image.save(p)),
        ("image.gif", lambda p: palette.save(p)),
        ("image.tga", lambda p: image.save(p)),
        ("image.ppm", lambda p: image.save(p)),
        ("grey.pgm", lambda p: image.convert("L").save(p)),
    ]


@pytest.mark.parametrize("name", ["qwen2_vl", "llava"])
def test_every_image_format_gives_the_processors_pixels(name, tmp_path, mmsp_bin):
    """Each mode and encoding PIL and mmsp both read, at a size that is resized (odd sides: the
    chroma planes' edges) and one that is not: every value equal to the processor's. Before
    libjpeg-turbo, stb_image's JPEGs were up to 3 levels off (106 on 4:2:2)."""
    family, cfg, model_dir, pre, processor = _model(name, tmp_path)
    lines, expected, names = [], [], []
    for w, h in [(113, 61), (56, 56)]:
        rgb = P.smooth_image(w, h, seed=w)
        for file_name, write in _format_cases(rgb):
            path = tmp_path / f"{w}x{h}-{file_name}"
            write(path)
            line, pixels = _line(family, cfg, processor, path)
            lines.append(line)
            expected.append(pixels)
            names.append(path.name)
    rc, err, got = _mmsp_pixels(mmsp_bin, model_dir, tmp_path, lines)
    assert rc == 0, err
    off = {n: _levels_off(family, pre, got[f"sample{i}.image0"], ref).max().item() * 255
           for i, (n, ref) in enumerate(zip(names, expected))}
    assert all(v <= BOUND * 255 for v in off.values()), {n: round(v, 3) for n, v in off.items() if v > BOUND * 255}


def test_images_mmsp_cannot_read_as_pil_does_are_refused(tmp_path, mmsp_bin):
    """16-bit grey (PIL clips it at 255) and CMYK JPEG are refused by the header, before a
    step; a truncated JPEG when decoded (PIL refuses it too) — each naming the file and rule."""
    family, cfg, model_dir, _, _ = _model("qwen2_vl", tmp_path)
    rgb = P.smooth_image(56, 56, seed=3)
    grey16 = tmp_path / "grey16.png"
    Image.fromarray(rgb[..., 0].astype(np.uint16) * 200).save(grey16)
    assert Image.open(grey16).mode == "I;16"
    cmyk = tmp_path / "cmyk.jpg"
    Image.fromarray(rgb).convert("CMYK").save(cmyk)
    whole = tmp_path / "whole.jpg"
    Image.fromarray(rgb).save(whole, quality=90)
    truncated = tmp_path / "truncated.jpg"
    truncated.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    with pytest.raises(OSError, match="truncated"):
        Image.open(truncated).convert("RGB")
    side = 56 // cfg["vision_config"]["patch_size"]
    rows = side * side // cfg["vision_config"]["spatial_merge_size"] ** 2
    for path, words in [(grey16, "is a 16-bit grey image: transformers' processors (PIL's I;16 → RGB) clip each "
                                 "value at 255"),
                        (cmyk, "is a JPEG of 4 components in CMYK or YCCK"),
                        (truncated, "the JPEG data ends early")]:
        block = [family.start_token, *[family.image_token] * rows, family.end_token]
        line = {"input_ids": [1, *block, 2], "images": [{"path": path.name}], "image_grid_thw": [[1, side, side]]}
        rc, err, _ = _mmsp_pixels(mmsp_bin, model_dir, tmp_path, [line])
        assert rc != 0 and str(path) in err and words in err, (path.name, rc, err)
