"""What each rank runs in test_patch_reliability.py beyond sp_checks.py's cases: ranks that
disagree on a model, a token id or an op's call, a mesh disagreement while rank 0 exits, and a
peer stopped or killed under FSDP2. Each a ValueError on every rank, never a signal or a wait
past the mesh's timeout."""
import contextlib
import copy
import json
import os
import signal
import sys
import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from sp_checks import _qwen2_vl, families_reference_loss, hf_batch


def _refused_on_every_rank(call, words, rank):
    """call() raises a ValueError whose message holds `words` (a string or, per rank, a dict)."""
    want = words[rank] if isinstance(words, dict) else words
    with pytest.raises(ValueError) as raised:
        call()
    assert want in str(raised.value), f"rank {rank}: {raised.value}"


# --- the model and the token ids the ranks hold --------------------------------------------------

MODEL = "(model: its parameters' names, dtypes and shapes, FSDP2, checkpointing or grad mode)"


def model_and_token_ids_named_on_every_rank(rank, world):
    """A model in another dtype, or in no-grad mode, on rank 1 only (batch="shared"); a token id
    outside the vocabulary on every rank (torch's IndexError on one rank before: the others
    waited out the mesh's timeout); with batch="per_rank" an out-of-vocabulary id on rank 1's own
    batch and another dtype on rank 1: each a ValueError on every rank before the step's
    collectives. The ranks are in step after them (a step equals one process)."""
    import mmsp

    assert world == 2
    family, reference, samples = _qwen2_vl(rank)
    mesh = mmsp.Mesh(ring=world, timeout=timedelta(seconds=60))
    good = hf_batch(family, samples)
    other = copy.deepcopy(reference)
    mmsp.patch(other.float() if rank == 1 else other, mesh)
    _refused_on_every_rank(lambda: other(**good), f"rank 1's batch differs from rank 0's {MODEL}", rank)
    model = mmsp.patch(copy.deepcopy(reference), mesh)
    with torch.no_grad() if rank == 1 else contextlib.nullcontext():
        _refused_on_every_rank(lambda: model(**good), f"rank 1's batch differs from rank 0's {MODEL}", rank)
    vocab = reference.get_input_embeddings().num_embeddings
    bad = {k: v.clone() for k, v in good.items()}
    bad["input_ids"][0, 3] = bad["labels"][0, 3] = vocab
    _refused_on_every_rank(lambda: model(**bad), f"mmsp.patch: input_ids[0, 3] = {vocab} is outside the model's "
                                                 f"vocabulary 0..{vocab - 1}", rank)
    per_rank = mmsp.patch(copy.deepcopy(reference), mesh, batch="per_rank")
    mine = hf_batch(family, samples[rank:rank + 1])
    if rank == 1:
        mine["input_ids"][0, 2] = -1
    _refused_on_every_rank(lambda: per_rank(**mine), "mmsp.patch (batch='per_rank'): rank 1's batch: input_ids[0, 2] = "
                                                     "-1 is outside the model's vocabulary", rank)
    odd = copy.deepcopy(reference)
    mmsp.patch(odd.float() if rank == 1 else odd, mesh, batch="per_rank")
    _refused_on_every_rank(lambda: odd(**hf_batch(family, samples[rank:rank + 1])),
                           "mmsp.patch (batch='per_rank'): rank 1 holds another model or patch options than rank 0",
                           rank)
    loss = model(**good).loss  # still in step
    want = families_reference_loss(reference, family, samples)
    assert abs(loss.item() - want.item()) <= 1e-12 * abs(want.item()), (loss.item(), want.item())


# --- the ops' calls --------------------------------------------------------------------------------

def op_calls_that_differ_named_on_every_rank(rank, world):
    """mmsp.ops and torch.ops.mmsp with calls the ranks disagree on: Ulysses' scatter refused by
    rank 1 only (the others entered the exchange alone before), gather in another dtype on rank 1,
    all_to_all_v counts that do not fit (SIGABRT in Gloo before), attention in another dtype,
    different ops on the two ranks. Each a ValueError on every rank naming the ranks; a correct
    exchange after them works."""
    import mmsp

    assert world == 2
    mesh = mmsp.Mesh(ulysses=world, timeout=timedelta(seconds=60))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 4, 3, generator=g, dtype=torch.float64)
    where = "mmsp.ops.ulysses_scatter_heads on group ulysses[dp=0,r=0]"
    _refused_on_every_rank(lambda: mmsp.ops.ulysses_scatter_heads(x if rank == 0 else x[:3], [4, 4], mesh),
                           {0: f"{where} (2 ranks): rank 1 refused its inputs (its own error says why); stopped "
                               "before the exchange, on every rank of the group",
                            1: f"{where}: the tensor has 3 tokens but tokens[1] (this rank's) is 4 (on rank 1; "
                               "stopped before the exchange"}, rank)
    y = torch.randn(8, 2, 3, generator=g, dtype=torch.float64)
    _refused_on_every_rank(lambda: mmsp.ops.ulysses_gather_heads(y if rank == 0 else y.float(), [4, 4], mesh),
                           "mmsp.ops.ulysses_gather_heads on group ulysses[dp=0,r=0] (2 ranks): the ranks' dtypes, "
                           "trailing shapes or tokens lists differ (rank 0 / rank 1 hold different ones)", rank)
    send, recv = ([2, 3], [2, 2]) if rank == 0 else ([2, 2], [1, 2])
    rows = torch.randn(sum(send), 5, generator=g, dtype=torch.float64)
    _refused_on_every_rank(lambda: torch.ops.mmsp.all_to_all_v(rows, send, recv, mesh.op_groups["context"]),
                           "mmsp.ops.all_to_all_v on group context[dp=0] (2 ranks): rank 0 sends rank 1 3 rows but "
                           "rank 1 expects 1 from it", rank)
    shard = mmsp.plan(_tiny_config(), _one_sequence(), mesh)
    T = len(shard.token_ids)
    q = torch.randn(T, 4, 8, generator=g, dtype=torch.float64)
    _refused_on_every_rank(lambda: mmsp.ops.attention(q if rank == 0 else q.float(), q if rank == 0 else q.float(),
                                                      q if rank == 0 else q.float(), shard, mesh),
                           "mmsp.ops.context_attention on group context[dp=0] (2 ranks): the ranks' dtypes, trailing "
                           "shapes, layouts or options differ", rank)
    _refused_on_every_rank(lambda: mmsp.ops.ulysses_scatter_heads(x, [4, 4], mesh) if rank == 0 else
                           mmsp.ops.ulysses_gather_heads(y, [4, 4], mesh),
                           "the ranks called different ops here (rank 0 called ulysses_scatter_heads; rank 1 called "
                           "ulysses_gather_heads)", rank)
    back = mmsp.ops.ulysses_gather_heads(mmsp.ops.ulysses_scatter_heads(x, [4, 4], mesh), [4, 4], mesh)
    assert torch.equal(back, x), "the round trip after the refusals"


def _tiny_config():
    from sp_checks import CONFIG

    return CONFIG


def _one_sequence():
    return {"sequences": [{"input_ids": list(range(10, 42)), "loss_mask": [0] + [1] * 31}]}


# --- a Mesh disagreement while rank 0 ends at once -------------------------------------------------

def _spin():
    while True:
        pass


def mesh_disagreement_reaches_ranks_while_rank_0_exits(rank, world, out):
    """The ranks ask for different meshes and each ends its program on the ValueError; rank 0,
    which hosts the default group's TCPStore, ends at once (os._exit). Rank 1 is slow (a busy
    thread holds the GIL for 1 s at a time, as on a loaded host): before, it read the store
    after rank 0 had taken it away and got torch's DistNetworkError; now rank 0 waits (at most
    the timeout) until every rank has read, so every rank gets mmsp's ValueError."""
    import mmsp

    Mesh = mmsp.Mesh  # imported before the spinning starts: each file read would wait for the GIL
    if rank == 1:
        sys.setswitchinterval(1.0)
        threading.Thread(target=_spin, daemon=True).start()
    try:
        Mesh(ring=world if rank == 0 else 1, dp=1 if rank == 0 else world, timeout=timedelta(seconds=20))
        message = "(no error)"
    except Exception as e:
        message = f"{type(e).__name__}: {e}"
    with open(f"{out}.{rank}", "w") as f:
        f.write(message)
    if rank == 0:
        os._exit(0)


# --- a peer stopped or killed under FSDP2 ------------------------------------------------------------

def fsdp_peer_lost(rank, world, how, out):
    """dp = world, FSDP2 over mesh.fsdp_mesh() (mmsp.fully_shard), the mesh's timeout 3 s against
    the default group's 600 s (run_bounded). After a first step, the last rank stops (SIGSTOP)
    before the forward or dies (SIGKILL) before the backward; rank 0 records how long its step ran
    and its error, then ends the stopped rank."""
    import mmsp

    family, model, samples = _qwen2_vl(rank)
    # Building the model takes each rank its own time (seconds on a loaded machine): the ranks
    # meet first, so that the mesh's 3 s bounds the collectives, not the start-up's skew.
    dist.barrier()
    mesh = mmsp.Mesh(dp=world, timeout=timedelta(seconds=3))
    mmsp.patch(model, mesh)
    mmsp.fully_shard(model, mesh)
    batch = hf_batch(family, samples)
    model(**batch).loss.backward()  # FSDP2's lazy start and a whole step, every rank
    if rank == world - 1:
        with open(out + ".pid", "w") as f:
            f.write(str(os.getpid()))
    dist.barrier()
    if rank == world - 1:
        if how == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        loss = model(**batch).loss
        os.kill(os.getpid(), signal.SIGKILL)
        loss.backward()
        raise AssertionError("the killed rank ran on")
    if rank != 0:
        return
    loss = None if how == "stop" else model(**batch).loss
    start = time.monotonic()
    try:
        (model(**batch).loss if loss is None else loss).backward()
        message = None
    except Exception as e:
        message = f"{type(e).__name__}: {e}"
    elapsed = time.monotonic() - start
    if how == "stop":
        with open(out + ".pid") as f:
            os.kill(int(f.read()), signal.SIGKILL)
    with open(out, "w") as f:
        json.dump({"elapsed": elapsed, "message": message}, f)
