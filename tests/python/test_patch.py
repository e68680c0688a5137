"""mmsp.patch on transformers' own models: every family, patched and run on 1-4 Gloo
processes, equals the unpatched model on one process (loss and every gradient, fp64).
The tiny random models and the data (two sequences, three images, images across shard
borders) are tests/hf/families.py's."""
import pytest

import sp_checks
import sp_ranks

CASES = [  # (world, ring, ulysses, placement): every scheme, uneven splits, a dp axis
    (1, 1, 1, "zigzag"),
    (2, 2, 1, "zigzag"),
    (2, 1, 2, "zigzag"),
    (3, 3, 1, "adaptive"),
    (4, 2, 2, "zigzag"),
    (4, 2, 1, "zigzag"),  # dp 2
]
FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "llava", "internvl"]


@pytest.mark.parametrize("world,ring,ulysses,placement", CASES)
def test_patched_model_equals_one_process(world, ring, ulysses, placement, tmp_path):
    # Every family in one launch of the ranks: starting processes (torch, transformers) costs
    # more than a tiny model's step.
    # Qwen3.5's Gated DeltaNet layers are patched for the zigzag placement only.
    families = [f for f in FAMILIES if placement == "zigzag" or f != "qwen3_5"]
    sp_ranks.run(world, sp_checks.patch_equals_one_process, families, ring, ulysses, placement, tmp_path=tmp_path)



def test_a_processors_video_batch_equals_one_process(tmp_path):
    # transformers 5.x's Qwen3-VL processor given an mp4, its batch straight into the patch.
    from transformers.utils import logging

    import tiny_models
    from test_prepare import write_clip

    logging.set_verbosity_error()
    tiny_models.build("qwen3_vl", str(tmp_path / "qwen3_vl"))
    clip = str(write_clip(tmp_path / "clip.mp4"))
    sp_ranks.run(2, sp_checks.patch_processor_video_equals_one_process, 2, 1, str(tmp_path / "qwen3_vl"), clip,
                 tmp_path=tmp_path)


def test_mixture_of_experts_equal_one_process(tmp_path):
    # Qwen3-VL-MoE and Qwen3.5-MoE on ring 2 x ulysses 2: without and with expert parallelism
    # (over 2 and 4 of the ranks), and with mmsp.fully_shard; one set of ranks for all (CI time).
    sp_ranks.run(4, sp_checks.patch_moe_equals_one_process, ["qwen3_vl_moe", "qwen3_5_moe"], 2, 2,
                 [(1, False), (2, False), (4, False), (4, True)], tmp_path=tmp_path)


@pytest.mark.parametrize("world,ring,ulysses", [(1, 1, 1), (4, 2, 2)])
def test_patched_videos_equal_one_process(world, ring, ulysses, tmp_path):
    # Qwen batches with videos and images (Qwen3-VL, Qwen3.5: one block per temporal patch).
    sp_ranks.run(world, sp_checks.patch_videos_equal_one_process, ring, ulysses,
                 ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5"], tmp_path=tmp_path)
