"""The decoder's attention under mmsp.patch: transformers' attention interface, registered as
"mmsp", runs mmsp.ops.attention (local, Ulysses, ring or hybrid) on this rank's slots."""

import torch

from mmsp import op_agreement as _agreement
from mmsp import ops as _ops
from mmsp.transformers_patch.state import current_step

NAME = "mmsp"


def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """query [1, H, L, D], key/value [1, H_kv, L, D] -> ([1, L, H, D], None)."""
    if query.shape[0] != 1:  # the decoder ran without the patched forward
        raise ValueError(f"mmsp.patch: attention got a batch of {query.shape[0]} rows; the patched forward "
                         "packs the batch into one row per rank, so the decoder ran without it: was the model's "
                         "forward replaced after mmsp.patch (TRL's trainers install their fused LM head when built: "
                         "patch after building the trainer), or does an unpatched model share the patched one's "
                         "config?")
    if dropout:
        raise ValueError(f"mmsp.patch: attention dropout {dropout} is not supported (training is exact)")
    step = current_step("the decoder's attention")
    q, k, v = query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1)
    if torch.compiler.is_compiling():  # the op's kernel reads the step's agreement at run time
        out = _ops.attention(q, k, v, step.shard, step.mesh, causal=True, scale=scaling)
    else:
        with _agreement.agreed():  # the patched step was agreed once (its batch check); also in a recompute
            out = _ops.attention(q, k, v, step.shard, step.mesh, causal=True, scale=scaling)
    return out.unsqueeze(0), None


def register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, attention)
