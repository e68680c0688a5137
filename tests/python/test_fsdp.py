"""mmsp.patch composed with FSDP2 and activation checkpointing on real Gloo ranks: one
DeviceMesh (mmsp.Mesh.from_device_mesh), fully_shard per vision block and decoder layer on
its folded dp_shard x sp mesh, two SGD steps = one process (fp64, every weight and
gradient to 1e-9; Qwen3.5: see fsdp_checks)."""
import pytest

import fsdp_checks
import sp_ranks

COMBOS = [(False, False), (True, False), (False, True), (True, True)]  # (FSDP2, checkpointing)
# (dp_shard, ring) was cut for CI's time (2026-12-02): ring under FSDP2 in the (4,) ring and
# (ring, ulysses) meshes, dp_shard beside an SP axis in (dp_shard, ulysses).
MESHES = [  # (DeviceMesh shape, its dimension names): dp 2 x sp 2 and sp 4
    ((2, 2), ("dp_shard", "ulysses")),
    ((4,), ("ring",)),
    ((2, 2), ("ring", "ulysses")),
    ((2, 2), ("dp_replicate", "ring")),  # HSDP: fully_shard on (dp_replicate, ring)
]


@pytest.mark.parametrize("shape,names", MESHES)
def test_fsdp2_and_checkpointing_equal_one_process(shape, names, tmp_path):
    sp_ranks.run(4, fsdp_checks.fsdp_equals_one_process, ["qwen2_5_vl", "qwen3_5"], shape, names, COMBOS,
                 tmp_path=tmp_path)


def test_every_family_under_fsdp2_and_checkpointing_equals_one_process(tmp_path):
    # mmsp.fully_shard finds each family's layers and vision blocks in transformers' classes;
    # here it comes before mmsp.patch (the other tests: after).
    sp_ranks.run(4, fsdp_checks.fsdp_equals_one_process, ["qwen2_vl", "qwen3_vl", "llava", "internvl"], (2, 2),
                 ("ring", "ulysses"), [(True, True)], 2, None, True, tmp_path=tmp_path)


def test_videos_under_fsdp2_equal_one_process(tmp_path):
    # A rank the plan gives no video still runs the tower on one (times zero): FSDP2's collectives.
    import sp_checks

    sp_ranks.run(4, sp_checks.patch_videos_equal_one_process, 2, 2, ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5"],
                 True, tmp_path=tmp_path)


def test_fsdp2_on_ulysses_4_equals_one_process(tmp_path):
    # Ulysses over 4 ranks needs 4 K/V heads (the tiny models have 2): the same families with 4.
    sp_ranks.run(4, fsdp_checks.fsdp_equals_one_process, ["qwen2_5_vl", "qwen3_5"], (4,), ("ulysses",), COMBOS,
                 2, 4, tmp_path=tmp_path)


def test_fsdp2_mixed_precision_trains(tmp_path):
    sp_ranks.run(4, fsdp_checks.fsdp_mixed_precision_trains, "qwen2_5_vl", (2, 2), ("ring", "ulysses"),
                 tmp_path=tmp_path)


def test_device_mesh_mistakes_are_named(tmp_path):
    sp_ranks.run(4, fsdp_checks.device_mesh_mistakes_named, tmp_path=tmp_path)


def test_trainer_on_a_model_sharded_with_fsdp2_equals_one_process(tmp_path):
    """transformers.Trainer on the patched Qwen2.5-VL sharded with FSDP2 (ring 2 x ulysses 2)
    = the Trainer on one process: every weight after two steps of two accumulated
    micro-batches, gradients clipped (at 0.05: clipping acts), to 1e-9 of its change (fp64).
    (accelerate's own FSDP plugin needs a GPU per process: on CPU processes it is never on.)"""
    import torch

    import sp_checks

    sp_ranks.run(4, sp_checks.trainer_run, 2, 2, 1, str(tmp_path / "mmsp.pt"), "qwen2_5_vl", True, 0.05,
                 tmp_path=tmp_path)
    sp_ranks.run(1, sp_checks.trainer_run, 1, 1, 4, str(tmp_path / "one.pt"), "qwen2_5_vl", False, 0.05,
                 tmp_path=tmp_path)
    got, want = torch.load(tmp_path / "mmsp.pt"), torch.load(tmp_path / "one.pt")
    assert got["sharded"] == "DTensor", f"the Trainer trained {got['sharded']} parameters, not FSDP2's"
    assert all(n > 0.05 for n in want["grad_norms"]), f"clipping at 0.05 never acted: {want['grad_norms']}"
    assert got["grad_norms"] == pytest.approx(want["grad_norms"], rel=1e-9), (got["grad_norms"], want["grad_norms"])
    sp_checks.assert_trainer_runs_equal(got, want)
