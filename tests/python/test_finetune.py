"""Fine-tuning through mmsp.patch on real Gloo ranks: frozen parts (requires_grad_(False)) and
peft's LoRA models, alone and under mmsp.fully_shard, every family, = one process (fp64, the
loss and every gradient). A frozen tower on a rank that encodes no image must not run the
vision exchange's backward that the other ranks skip (vision.py)."""
import pytest

import finetune_checks
import sp_ranks

# Each family once on a multi-rank mesh (ring 2; ring 2 x ulysses 2), and two under FSDP2:
# the ranks' start and a tiny model's step cost ~10 s each on the 2-core machine.
CASES = [  # (world, ring, ulysses, fsdp, families)
    (2, 2, 1, False, ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]),
    (4, 2, 2, False, ["llava", "internvl", "qwen3_5"]),
    (4, 2, 2, True, ["qwen2_vl"]),
]


@pytest.mark.parametrize("world,ring,ulysses,fsdp,families", CASES)
def test_frozen_parts_and_peft_equal_one_process(world, ring, ulysses, fsdp, families, tmp_path):
    sp_ranks.run(world, finetune_checks.frozen_parts_and_peft_equal_one_process, families, ring, ulysses, fsdp,
                 tmp_path=tmp_path)
