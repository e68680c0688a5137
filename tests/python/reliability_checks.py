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
