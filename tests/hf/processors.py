"""The image processor transformers loads for each family (AutoImageProcessor; test_pixels.py
names the backend: PIL, whose pixels mmsp's are, or torchvision, which transformers picks when
it is installed), configured as the released model's preprocessor_config.json is, at the tiny
models' sizes (configs/tiny-*.json)."""
import json
import os

import numpy as np

CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
HALF = [0.5, 0.5, 0.5]


def preprocessor_config(family_name: str, cfg: dict) -> dict:
    v = cfg["vision_config"]
    if family_name.startswith("qwen"):
        p = v["patch_size"]
        half = family_name in ("qwen3_vl", "qwen3_5")
        # The released min/max pixels scaled to the tiny patches: 4 to 64 merge windows.
        unit = (p * v["spatial_merge_size"]) ** 2
        return {"image_processor_type": "Qwen2VLImageProcessor", "do_resize": True, "resample": 3,
                "size": {"shortest_edge": 4 * unit, "longest_edge": 64 * unit},
                "patch_size": p, "temporal_patch_size": v["temporal_patch_size"],
                "merge_size": v["spatial_merge_size"], "do_rescale": True, "rescale_factor": 1 / 255,
                "do_normalize": True, "image_mean": HALF if half else CLIP_MEAN,
                "image_std": HALF if half else CLIP_STD, "do_convert_rgb": True}
    if family_name == "llava":
        s = v["image_size"]
        return {"image_processor_type": "CLIPImageProcessor", "do_resize": True, "size": {"shortest_edge": s},
                "resample": 3, "do_center_crop": True, "crop_size": {"height": s, "width": s},
                "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
                "image_mean": CLIP_MEAN, "image_std": CLIP_STD, "do_convert_rgb": True}
    s = v["image_size"][0]
    return {"image_processor_type": "GotOcr2ImageProcessor", "do_resize": True, "size": {"height": s, "width": s},
            "resample": 3, "crop_to_patches": True, "min_patches": 1, "max_patches": 12,
            "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
            "image_mean": IMAGENET_MEAN, "image_std": IMAGENET_STD, "do_convert_rgb": True}


def write_preprocessor(model_dir: str, family_name: str, cfg: dict) -> dict:
    pre = preprocessor_config(family_name, cfg)
    with open(os.path.join(model_dir, "preprocessor_config.json"), "w") as f:
        json.dump(pre, f, indent=2)
    return pre


def smooth_image(width: int, height: int, seed: int) -> np.ndarray:
    """A photo-like RGB image: smooth gradients and blobs plus a little noise, so that
    resampling differences show as they would on real pictures (not on pure noise, where
    every filter disagrees, nor on flat colour, where none does)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    img = np.zeros((height, width, 3))
    for c in range(3):
        for _ in range(4):
            cx, cy = rng.uniform(0, width), rng.uniform(0, height)
            r = rng.uniform(0.15, 0.5) * max(width, height)
            img[..., c] += rng.uniform(-1, 1) * np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * r * r))
        img[..., c] += 0.3 * np.sin(x / rng.uniform(3, 12) + rng.uniform(0, 6))
    img += rng.normal(0, 0.05, img.shape)
    img = (img - img.min()) / (img.max() - img.min())
    return (img * 255).round().astype(np.uint8)
