"""The patched forward's per-token values: log p(label) (and the entropy) of every labelled
token, in the batch's own layout [B, T], at a temperature (mmsp.rl: docs/rl.md).

`model(**batch, return_token_logprobs=True, temperature=τ)` gives `out.token_logprobs [B, T]`
(position t: log p(labels[b, t] | tokens before t) under softmax(logits / τ); 0 where the label
is -100 and at t = 0), with `return_token_entropy=True` also `out.token_entropy`, and `out.loss`
the mean negative log-likelihood of the labels at τ. TRL's fused-head call, `model(**batch,
labels=labels, fused_lm_head=True)`, gets what TRL's `add_fused_lm_head` returns: `log_probs`,
`entropy`, `mean_logits`, `is_top1`, `log_sum_sq_probs`, `label_mask` [B, T - 1] and `loss`.
The values are made where this rank's hidden states are, a chunk of labelled slots at a time
(mmsp.rl.token_head: never [T, V]), and put in the batch's layout by one all-reduce of the
B x T values (mmsp.rl.token_batch).
"""
from dataclasses import dataclass
from typing import Any, Optional

import torch
from transformers.utils import ModelOutput

from mmsp.rl.token_batch import to_batch
from mmsp.rl.token_head import token_head
from mmsp.transformers_patch import gradients as _gradients
from mmsp.transformers_patch.state import PatchState


@dataclass
class TokenValuesOutput(ModelOutput):
    """The patched forward's output when per-token values are asked for (logits: never made)."""
    loss: Optional[torch.Tensor] = None
    logits: Optional[torch.Tensor] = None
    token_logprobs: Optional[torch.Tensor] = None  # [B, T]
    token_entropy: Optional[torch.Tensor] = None   # [B, T]
    # TRL's fused-head fields ([B, T - 1]: position t predicts token t + 1)
    log_probs: Optional[torch.Tensor] = None
    entropy: Optional[torch.Tensor] = None
    log_sum_sq_probs: Optional[torch.Tensor] = None
    mean_logits: Optional[torch.Tensor] = None
    is_top1: Optional[torch.Tensor] = None
    label_mask: Optional[torch.Tensor] = None
    aux_loss: Optional[torch.Tensor] = None


def fused_head_temperature(forward: Any) -> float:
    """The temperature of TRL's fused head when `forward` is the one trl's add_fused_lm_head
    installed (its trainers install it in their constructor, before mmsp.patch replaces it), else 1:
    the patched forward then answers TRL's `fused_lm_head=True` calls at the trainer's temperature."""
    code = getattr(getattr(forward, "__func__", forward), "__code__", None)
    closure = getattr(getattr(forward, "__func__", forward), "__closure__", None)
    if code is None or closure is None or code.co_name != "_fused_forward" or "temperature" not in code.co_freevars:
        return 1.0
    return float(closure[code.co_freevars.index("temperature")].cell_contents)


def _head_weights(model: Any) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    head = model.get_output_embeddings()
    weight, bias = head.weight, head.bias
    if hasattr(weight, "full_tensor"):  # FSDP2 outside its unsharded forward: the whole weight (differentiable)
        weight = weight.full_tensor()
        bias = bias.full_tensor() if bias is not None else None
    return weight, bias


def watch_backward(t: torch.Tensor, state: PatchState, model: Any, fsdp: bool) -> None:
    """As the patched loss does (step._batch_loss): the backward that reaches `t` first sets
    aside the gradients earlier backwards left and sums this one's over the world at its end.
    The weights are kept for every backward through `t` (retain_graph: one per objective)."""
    if not t.requires_grad:
        return
    state.pending = True
    params = [] if fsdp else [p for p in model.parameters() if p.requires_grad]
    if not fsdp:
        state.params = params

    def backward_begins(grad: torch.Tensor) -> torch.Tensor:
        if fsdp:
            state.pending = False
        else:
            if state.backward is None:
                state.params = params
            _gradients.at_backward_start(state)
        return grad

    t.register_hook(backward_begins)


@dataclass(frozen=True)
class StepLayout:
    """The step's batch as the per-token values lay it out: its sequences, the longest one's
    tokens, and this rank's rows of them (batch='per_rank'; None: it passed the whole batch)."""
    sequences: int
    width: int
    rows: Optional[tuple[int, int]]

    @staticmethod
    def of(batch: dict, rank: int) -> "StepLayout":
        counts = batch.get("rows_of_ranks")
        return StepLayout(len(batch["sequences"]), max(len(s["input_ids"]) for s in batch["sequences"]),
                          None if counts is None else (sum(counts[:rank]), counts[rank]))


def _at_columns(packed: torch.Tensor, attention_mask: Optional[torch.Tensor], shape: torch.Size) -> torch.Tensor:
    """[k, B, width] by each sequence's own tokens -> [k, B, T] at their columns of the batch
    (the columns whose attention_mask is 1, in order: right or left padding alike)."""
    k, B, width = packed.shape
    T = shape[1]
    if attention_mask is None:
        attention_mask = torch.ones(shape, dtype=torch.long)
    src: list[int] = []
    dst: list[int] = []
    for b in range(B):
        columns = attention_mask[b].nonzero()[:, 0].tolist()
        src += range(b * width, b * width + len(columns))
        dst += [b * T + c for c in columns]
    device = packed.device
    out = packed.new_zeros(k, B * T).index_copy(1, torch.tensor(dst, dtype=torch.long, device=device),
                                               packed.reshape(k, -1)[:, torch.tensor(src, dtype=torch.long,
                                                                                     device=device)])
    return out.view(k, B, T)


@torch.compiler.disable  # an all-reduce and a backward hook: eager under torch.compile(model)
def token_values(model: Any, state: PatchState, shard: Any, hidden: torch.Tensor,
                 labels: torch.Tensor, attention_mask: Optional[torch.Tensor], *, temperature: float, entropy: bool, fused: bool,
                 fsdp: bool, batch_loss: Any) -> TokenValuesOutput:
    """This rank's hidden states [L, h] -> the output described in the module doc."""
    device = hidden.device
    slot_labels = shard.labels.to(device)
    slots = (slot_labels != -100).nonzero()[:, 0]
    weight, bias = _head_weights(model)
    logp, ent, mean_logit, top1, log_sum_sq = token_head(hidden[slots], weight, bias, slot_labels[slots],
                                                         temperature)
    wanted = [logp] + ([ent] if entropy or fused else []) + ([mean_logit, top1, log_sum_sq] if fused else [])
    step: StepLayout = state.step_layout
    packed = to_batch(torch.stack(wanted), shard, slots.cpu(), step.sequences, step.width, state.mesh, step.rows,
                      per_rank=step.rows is not None)
    per_token = _at_columns(packed, attention_mask, labels.shape)
    watch_backward(per_token, state, model, fsdp)
    loss = batch_loss(-logp.sum() / max(shard.label_count, 1), state, model, fsdp)
    if not fused:
        return TokenValuesOutput(loss=loss, token_logprobs=per_token[0],
                                 token_entropy=per_token[1] if entropy else None)
    shifted = per_token[:, :, 1:]
    return TokenValuesOutput(loss=loss, log_probs=shifted[0], entropy=shifted[1], mean_logits=shifted[2],
                             is_top1=shifted[3].bool(), log_sum_sq_probs=shifted[4],
                             label_mask=labels[:, 1:] != -100)
