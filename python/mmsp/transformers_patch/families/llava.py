"""LLaVA: every image one fixed-size grid of image_seq_length placeholders."""

from mmsp.transformers_patch.families.image_only import ImageOnly, image_side_in_patches


class Llava(ImageOnly):
    name = "llava"

    def serves(self, conventions, config):
        return conventions["name"] == "llava"

    def grids(self, config, image_token, b, ids, placeholders):
        per_image = config.image_seq_length
        if placeholders % per_image:
            raise ValueError(f"mmsp.patch: sequence {b} has {placeholders} image tokens, not a multiple of "
                             f"image_seq_length {per_image}")
        side = image_side_in_patches(config)
        return [[1, side, side]] * (placeholders // per_image)

    def pixel_rows(self, grids):
        return [1] * len(grids)
