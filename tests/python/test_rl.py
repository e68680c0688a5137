"""mmsp.rl on transformers' own models of every family, 1-4 Gloo processes: the patched
model's per-token log-probs and entropy = transformers' log_softmax at the labels on one
process, and every RL objective's loss and gradients = one process (rl_checks.py)."""
import pytest
import torch

import rl_checks
import sp_ranks

FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "llava", "internvl"]
MESHES = [  # (world, ring, ulysses, families): dp fills the rest; every family on 1, 2 and 4 ranks
    (1, 1, 1, FAMILIES),
    (2, 2, 1, FAMILIES),
    (4, 2, 2, ["qwen2_vl", "qwen3_vl", "qwen3_5"]),
    (4, 2, 1, ["qwen2_5_vl", "llava", "internvl"]),  # dp 2: a dp row may hold only text
]


@pytest.mark.parametrize("world,ring,ulysses,families", MESHES)
def test_objectives_equal_one_process(world, ring, ulysses, families, tmp_path):
    sp_ranks.run(world, rl_checks.rl_objectives_equal_one_process, families, ring, ulysses, tmp_path=tmp_path)


def test_per_rank_losses_average_as_ddp(tmp_path):
    sp_ranks.run(2, rl_checks.per_rank_losses_average_as_ddp, "qwen2_vl", [[0, 3], [1]], tmp_path=tmp_path)


def test_bad_inputs_refused_on_every_rank(tmp_path):
    sp_ranks.run(2, rl_checks.bad_inputs_refused_on_every_rank, tmp_path=tmp_path)


# --- against TRL (requirements/hf.txt pins trl) ----------------------------------------------------

def test_trl_grpo_loss_equals_one_process(tmp_path):
    sp_ranks.run(2, rl_checks.trl_grpo_loss_equals_one_process, 1, 2, str(tmp_path), tmp_path=tmp_path)


def test_trl_dpo_loss_equals_one_process(tmp_path):
    sp_ranks.run(4, rl_checks.trl_dpo_loss_equals_one_process, 2, 2, str(tmp_path), tmp_path=tmp_path)


def test_trl_dpo_train_equals_one_process(tmp_path):
    """TRL's DPOTrainer.train() on 2 ranks, the policy patched (batch="per_rank") = one process."""
    sp_ranks.run(1, rl_checks.trl_dpo_train, str(tmp_path), str(tmp_path / "one.pt"), tmp_path=tmp_path)
    sp_ranks.run(2, rl_checks.trl_dpo_train, str(tmp_path), str(tmp_path / "mmsp.pt"), tmp_path=tmp_path)
    rl_checks.assert_dpo_runs_equal(torch.load(tmp_path / "mmsp.pt"), torch.load(tmp_path / "one.pt"))
