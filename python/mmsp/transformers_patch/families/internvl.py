"""InternVL: each run of image tokens is one image of run / image_seq_length tiles."""

from mmsp.transformers_patch.families.image_only import ImageOnly, image_side_in_patches


class InternVL(ImageOnly):
    name = "internvl"

    def serves(self, conventions, config):
        return conventions["name"] == "internvl"

    def grids(self, config, image_token, b, ids, placeholders):
        per_image, side = config.image_seq_length, image_side_in_patches(config)
        runs, run = [], 0
        for i in ids + [None]:
            if i == image_token:
                run += 1
            elif run:
                runs.append(run)
                run = 0
        return [[r // per_image, side, side] for r in runs]

    def pixel_rows(self, grids):
        return [t for t, _, _ in grids]
