"""Qwen2-VL, Qwen2.5-VL ("qwen": mRoPE positions, grids per image and video) and Qwen3-VL,
Qwen3.5 ("qwen3": the same with deepstack rows, and each temporal patch of a video its own
vision block after its timestamp text)."""

from typing import Any

import torch

from mmsp.transformers_patch.families.kind import Kind, VisionReader


def _video_blocks(family, video_grid_thw, second_per_grid_ts):
    """A batch's videos as the planner's vision blocks, in order: (grid, seconds or None).
    Qwen3-VL and Qwen3.5 put each temporal patch in its own block (after its timestamp
    text), so a video of t temporal patches is t blocks of grid [1, h, w]."""
    grids = video_grid_thw.tolist() if video_grid_thw is not None else []
    seconds = second_per_grid_ts.tolist() if second_per_grid_ts is not None else [None] * len(grids)
    if len(seconds) != len(grids):
        raise ValueError(f"mmsp.patch: second_per_grid_ts has {len(seconds)} entries for {len(grids)} videos")
    if family.frames_as_blocks:
        return [([1, h, w], None) for t, h, w in grids for _ in range(t)]
    return list(zip(grids, seconds))


def _take_blocks(blocks, at, placeholders, merge, what, b):
    """The vision blocks (from `at`) whose placeholder tokens sequence b holds."""
    mine = []
    while placeholders > 0 and at < len(blocks):
        t, h, w = blocks[at][0]
        mine.append(blocks[at])
        placeholders -= t * h * w // merge
        at += 1
    if placeholders != 0:
        raise ValueError(f"mmsp.patch: sequence {b}'s {what} tokens do not match {what}_grid_thw's rows")
    return mine, at


class _QwenReader(VisionReader):
    def __init__(self, family, image_grid_thw, video_grid_thw, second_per_grid_ts):
        self.family = family
        self.images = [(grid, None) for grid in (image_grid_thw.tolist() if image_grid_thw is not None else [])]
        self.videos = _video_blocks(family, video_grid_thw, second_per_grid_ts)
        self.g = self.v = 0

    def of_sequence(self, b, ids):
        f = self.family
        seq: dict[str, Any] = {}
        mine, self.g = _take_blocks(self.images, self.g, sum(1 for i in ids if i == f.image_token), f.merge, "image", b)
        if mine:
            seq["image_grid_thw"] = [grid for grid, _ in mine]
        frames, self.v = _take_blocks(self.videos, self.v, sum(1 for i in ids if i == f.video_token), f.merge,
                                      "video", b)
        if frames:
            seq["video_grid_thw"] = [grid for grid, _ in frames]
            if any(sec is not None for _, sec in frames):
                seq["second_per_grid_ts"] = [sec for _, sec in frames]
        return seq

    def finish(self):
        if self.g != len(self.images):
            raise ValueError(f"mmsp.patch: image_grid_thw has {len(self.images)} rows but the sequences' image tokens "
                             f"use {self.g}")
        if self.v != len(self.videos):
            raise ValueError(f"mmsp.patch: video_grid_thw describes {len(self.videos)} vision blocks but the "
                             f"sequences' video tokens use {self.v}")


class Qwen(Kind):
    takes_videos = True
    encodes_with_grids = True

    def __init__(self, deepstack: bool):
        self.deepstack = deepstack
        self.name = "qwen3" if deepstack else "qwen"

    def serves(self, conventions, config):
        has_deepstack = bool(getattr(config.vision_config, "deepstack_visual_indexes", None))
        return bool(conventions["mrope"]) and has_deepstack == self.deepstack

    def reader(self, config, family, image_grid_thw, video_grid_thw, second_per_grid_ts):
        return _QwenReader(family, image_grid_thw, video_grid_thw, second_per_grid_ts)

    def pixel_rows(self, grids):
        return [t * h * w for t, h, w in grids]

    def encode(self, model, pixel_values, grid_thw, video=False):
        inner = model.model
        out = (inner.get_video_features if video else inner.get_image_features)(pixel_values, grid_thw)
        rows = torch.cat(list(out.pooler_output), dim=0)
        return rows, (list(out.deepstack_features) if self.deepstack else None)

    def decoder_inputs(self, positions, slots, length, deepstack, device):
        positions = positions[:, None, :]  # [3, 1, L]
        if not self.deepstack:
            return positions, {}
        mask = torch.zeros(1, length, dtype=torch.bool, device=device)
        mask[0, slots] = True
        return positions, {"visual_pos_masks": mask, "deepstack_visual_embeds": deepstack}


def deepstack_levels(config: Any) -> int:
    return len(getattr(config.vision_config, "deepstack_visual_indexes", []) or [])
