"""mmsp.patch and mmsp.Mesh under mistakes and failures, on real Gloo processes and
transformers' tiny Qwen2-VL (tests/hf/families.py): each mistake a ValueError on every rank
naming the rank and the rule, before the collectives it would break; a stopped peer named
within the mesh's timeout, not torch's 30 minutes. Each check runs under a deadline: a hang
fails it."""
import json

import pytest

import sp_checks
import sp_ranks


def test_a_rank_with_another_shared_batch_is_named_on_every_rank(tmp_path):
    sp_ranks.run_bounded(3, sp_checks.shared_batch_differences_named_on_every_rank, tmp_path=tmp_path,
                         deadline_s=240)


def test_a_rank_with_another_mesh_is_named_on_every_rank(tmp_path):
    sp_ranks.run_bounded(3, sp_checks.meshes_that_differ_named_on_every_rank, tmp_path=tmp_path, deadline_s=120)


@pytest.mark.parametrize("stop_at", ["mesh", "forward", "backward"])
def test_a_stopped_peer_ends_the_step_within_the_mesh_timeout(tmp_path, stop_at):
    """The loss and gradient sums (and the batch check) run on the mesh's world group: a peer
    stopped before the forward or the backward ends rank 0's step after the mesh's 3 s, with
    mmsp's message naming the group — not after the default group's timeout (here 600 s,
    torch's default 30 min) with Gloo's own error. A peer stopped before its Mesh is named."""
    out = str(tmp_path / "result.json")
    sp_ranks.run_bounded(2, sp_checks.stopped_peer_named_within_the_timeout, stop_at, out, tmp_path=tmp_path,
                         deadline_s=90)
    with open(out) as f:
        result = json.load(f)
    assert result["message"] is not None, "rank 0's step ended without an error"
    assert 2.5 <= result["elapsed"] <= 3 + 5, result
    if stop_at == "mesh":
        assert result["message"].startswith("ValueError: mmsp.Mesh: rank 1 did not construct mmsp.Mesh within 3 s"), \
            result["message"]
        return
    what = ("mmsp.patch (batch='shared'): exchanging the batch fingerprints" if stop_at == "forward" else
            "mmsp.patch: summing the gradients (")
    assert result["message"].startswith(f"ValueError: {what}"), result["message"]
    assert ": all_reduce on group world (2 ranks) failed: a peer rank died, hung or disagreed on the call (timeout " \
           "3 s)" in result["message"], result["message"]


@pytest.mark.parametrize("how", ["cpu", "row sums"])
def test_the_batch_fingerprint_sees_every_element(how):
    """A word changes with any one element (the smallest float step, a token id +1, one bf16
    pixel), with the dtype, the shape and the order of rows or columns; equal bytes give equal
    words whatever the thread count. "row sums" is the GPU's method, run here on the CPU (the
    integer arithmetic is the same)."""
    import torch

    from mmsp.transformers_patch import batch_fingerprint

    word = batch_fingerprint.tensor_word if how == "cpu" else batch_fingerprint.row_sums_word
    g = torch.Generator().manual_seed(0)
    for x in [torch.randn(37, 1176, generator=g), torch.randint(0, 640, (3, 50), generator=g),
              torch.randn(2, 3, 16, 16, generator=g).to(torch.bfloat16), torch.randn(5, generator=g).double()]:
        base = word(x)
        assert word(x.clone()) == base
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(1)
            assert word(x) == base
        finally:
            torch.set_num_threads(threads)
        for index in [(0,) * x.dim(), tuple(s - 1 for s in x.shape), tuple(s // 2 for s in x.shape)]:
            y = x.clone()
            if x.is_floating_point():
                y[index] = torch.nextafter(y[index], torch.tensor(float("inf"), dtype=x.dtype))
            else:
                y[index] += 1
            assert word(y) != base, (x.dtype, tuple(x.shape), index)
        assert word(x.float() if x.dtype != torch.float32 else x.double()) != base  # the dtype
        assert word(x.reshape(-1)) != base or x.dim() == 1  # the shape
        assert word(x.flip(0)) != base  # the order of rows
        if x.dim() > 1:
            assert word(x.flip(-1)) != base  # the order within a row


def test_a_model_or_token_ids_the_ranks_disagree_on_are_named_on_every_rank(tmp_path):
    import reliability_checks

    sp_ranks.run_bounded(2, reliability_checks.model_and_token_ids_named_on_every_rank, tmp_path=tmp_path,
                         deadline_s=120)


def test_op_calls_the_ranks_disagree_on_are_named_on_every_rank(tmp_path):
    import reliability_checks

    sp_ranks.run_bounded(2, reliability_checks.op_calls_that_differ_named_on_every_rank, tmp_path=tmp_path,
                         deadline_s=120)


def test_a_mesh_disagreement_reaches_every_rank_though_rank_0_exits_at_once(tmp_path):
    """Rank 0 hosts the TCPStore (as under mmsp-run) and exits on its ValueError at once."""
    import reliability_checks

    out = str(tmp_path / "message")
    sp_ranks.run_bounded(2, reliability_checks.mesh_disagreement_reaches_ranks_while_rank_0_exits, out,
                         tmp_path=tmp_path, deadline_s=60, store="tcp")
    for rank in range(2):
        with open(f"{out}.{rank}") as f:
            message = f.read()
        assert message.startswith("ValueError: mmsp.Mesh: the ranks asked for different meshes: "), (rank, message)


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_a_peer_lost_under_fsdp2_ends_the_step_within_the_mesh_timeout(tmp_path, how):
    """FSDP2's collectives run on mesh.fsdp_mesh()'s groups, made with the mesh's 3 s (not the
    default group's 600 s here, 30 min for Gloo by default), and fail with mmsp's words: a
    stopped peer after 3 s, a killed one at once."""
    import reliability_checks

    out = str(tmp_path / "result.json")
    sp_ranks.run_bounded(2, reliability_checks.fsdp_peer_lost, how, out, tmp_path=tmp_path, deadline_s=90)
    with open(out) as f:
        result = json.load(f)
    assert result["message"] is not None, "rank 0's step ended without an error"
    assert result["message"].startswith("ValueError: mmsp.fully_shard: FSDP2's "), result
    assert "on group dp_shard_sp (2 ranks) failed: a peer rank died, hung or disagreed on the call (timeout 3 s)" \
        in result["message"], result
    low, high = (2.5, 3 + 5) if how == "stop" else (0, 3 + 2)
    assert low <= result["elapsed"] <= high, result
    print(how, result)
