"""torch.compile and mmsp: the custom ops of torch.ops.mmsp pass torch.library.opcheck and equal
eager mmsp.ops bit for bit on 1, 2 and 4 Gloo ranks, and a patched model whose decoder layers
are compiled (no graph break, the mmsp ops nodes of the graph) equals the same model eager
(compile_checks.py; the package is the build's, MMSP_PACKAGE_PATH)."""
import pytest

import compile_checks
import mmsp  # noqa: F401  (the build's: conftest puts MMSP_PACKAGE_PATH first)
import sp_ranks


@pytest.mark.parametrize("world", [1, 4])  # (2: cut for CI's time, 2026-12-02)
def test_ops_pass_opcheck_and_equal_eager(world, tmp_path):
    sp_ranks.run(world, compile_checks.ops_pass_opcheck, tmp_path=tmp_path)


# aot_eager: the traced graph's ops as eager runs them (equal to rounding); inductor: its own
# generated kernels (held to fp32's scale: transformers' norms compute in fp32). The first case
# also compiles the whole patched model, torch.compile(model) (a storage error before issue 68:
# the batch's fingerprint was traced), in the same processes.
@pytest.mark.parametrize("family,world,ring,ulysses,backend,whole", [
    ("qwen2_5_vl", 2, 2, 1, "aot_eager", True),
    ("qwen3_5", 4, 2, 2, "aot_eager", False),
    ("qwen2_5_vl", 2, 2, 1, "inductor", False),
])
def test_compiled_patch_equals_eager(family, world, ring, ulysses, backend, whole, tmp_path):
    sp_ranks.run(world, compile_checks.compiled_patch_equals_eager, family, ring, ulysses, backend, whole,
                 tmp_path=tmp_path)
