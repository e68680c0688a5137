"""What LLaVA and InternVL share: images only (a video is an error), fixed-size images or tiles
whose placeholder runs give the grids, and transformers' get_image_features with the
config's vision_feature_layer and select strategy."""

from typing import Any

import torch

from mmsp.transformers_patch.families.kind import Kind, VisionReader


def image_side_in_patches(config: Any) -> int:
    side = config.vision_config.image_size
    side = side[0] if isinstance(side, (list, tuple)) else side
    patch = config.vision_config.patch_size
    patch = patch[0] if isinstance(patch, (list, tuple)) else patch
    return side // patch


class ImageReader(VisionReader):
    def __init__(self, kind: "ImageOnly", config, family, video_grid_thw, second_per_grid_ts):
        grids = video_grid_thw.tolist() if video_grid_thw is not None else []
        if second_per_grid_ts is not None and len(second_per_grid_ts.tolist()) != len(grids):
            raise ValueError(f"mmsp.patch: second_per_grid_ts has {len(second_per_grid_ts.tolist())} entries for "
                             f"{len(grids)} videos")
        if grids:
            raise ValueError(f"mmsp.patch: video_grid_thw given to a {kind.name} model, which takes no videos")
        self.kind, self.config, self.family = kind, config, family

    def of_sequence(self, b, ids):
        placeholders = sum(1 for i in ids if i == self.family.image_token)
        if not placeholders:
            return {}
        return {"image_grid_thw": self.kind.grids(self.config, self.family.image_token, b, ids, placeholders)}


class ImageOnly(Kind):
    def reader(self, config, family, image_grid_thw, video_grid_thw, second_per_grid_ts):
        return ImageReader(self, config, family, video_grid_thw, second_per_grid_ts)

    def grids(self, config: Any, image_token: int, b: int, ids: list[int], placeholders: int) -> list[list[int]]:
        raise NotImplementedError

    def encode(self, model, pixel_values, grid_thw, video=False):
        cfg = model.config
        out = model.model.get_image_features(pixel_values=pixel_values, vision_feature_layer=cfg.vision_feature_layer,
                                             vision_feature_select_strategy=cfg.vision_feature_select_strategy,
                                             return_dict=True).pooler_output
        if isinstance(out, (list, tuple)):
            out = torch.cat([o.reshape(-1, o.shape[-1]) for o in out], dim=0)
        return out.reshape(-1, out.shape[-1]), None
