"""mmsp.patch under the training loops users bring: gradient accumulation (both ways),
data-parallel loaders that give each rank its own batch (batch="per_rank"), and
transformers.Trainer itself on several processes — each against one process, fp64.
The tiny random models and the data are tests/hf/families.py's."""
import pytest

import sp_checks
import sp_ranks


@pytest.mark.parametrize("world,ring,ulysses", [(4, 2, 2)])
def test_gradient_accumulation_equals_one_process(world, ring, ulysses, tmp_path):
    sp_ranks.run(world, sp_checks.patch_accumulates_gradients, ring, ulysses, tmp_path=tmp_path)


# batch="per_rank": each rank's own batch (0, 1: tests/hf's sequences; 2: text only, so a
# rank may load no image at all while others encode its share), the step their union.
PER_RANK_CASES = [  # (world, ring, ulysses, each rank's samples)
    (3, 3, 1, [[0], [2], [1]]),
    (4, 2, 2, [[0], [1, 2], [2], [0]]),
]


@pytest.mark.parametrize("world,ring,ulysses,per_rank", PER_RANK_CASES)
def test_per_rank_batches_equal_one_process(world, ring, ulysses, per_rank, tmp_path):
    sp_ranks.run(world, sp_checks.patch_per_rank_batches_equal_one_process, ring, ulysses,
                 ["qwen2_vl", "qwen3_vl", "llava", "internvl"], per_rank, tmp_path=tmp_path)


# Videos with batch="per_rank": each rank's own sequences (videos and images), every video
# block's pixels routed from the rank that loaded it to the rank that encodes it.
@pytest.mark.parametrize("world,ring,ulysses,per_rank", [(2, 2, 1, [[1], [0]]), (4, 2, 2, [[0], [1], [1], [0]])])
def test_per_rank_videos_equal_one_process(world, ring, ulysses, per_rank, tmp_path):
    sp_ranks.run(world, sp_checks.patch_videos_equal_one_process, ring, ulysses, ["qwen2_5_vl", "qwen3_vl"],
                 False, per_rank, tmp_path=tmp_path)


def test_trainer_equals_one_process(tmp_path):
    """transformers.Trainer on 4 processes (ring 2 x ulysses 2, one sample a rank a micro-step,
    its own loader and sampler) with the patched model = the Trainer on one process with 4
    samples a micro-step: after two steps of two accumulated micro-batches, every weight's
    change to 1e-9 (fp64), the logged losses as logged."""
    import torch

    sp_ranks.run(4, sp_checks.trainer_run, 2, 2, 1, str(tmp_path / "mmsp.pt"), tmp_path=tmp_path)
    sp_ranks.run(1, sp_checks.trainer_run, 1, 1, 4, str(tmp_path / "one.pt"), tmp_path=tmp_path)
    sp_checks.assert_trainer_runs_equal(torch.load(tmp_path / "mmsp.pt"), torch.load(tmp_path / "one.pt"))


def test_a_bad_per_rank_batch_is_an_error_on_every_rank(tmp_path):
    sp_ranks.run(2, sp_checks.per_rank_bad_batch_named_on_every_rank, tmp_path=tmp_path)
