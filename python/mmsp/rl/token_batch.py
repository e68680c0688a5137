"""Per-token values of this rank's slots -> the batch's own layout [B, T], by one exchange.

Each rank writes the values of its labelled slots into a zero tensor of the step's batch
([sequences, longest sequence], value of slot (s, i) at [s, i + 1]: the label it predicts) and
one all-reduce over the world adds them: every position is some rank's, once. The result is
differentiable. With every rank passing the step's whole batch (the patch's batch="shared"),
every rank computes the same loss from the same [B, T] values, so the gradient of a position
goes back to the rank whose slot made it, unchanged: no exchange in the backward. With each
rank passing its own rows (batch="per_rank"), each rank's loss reads only its rows: the
gradients are summed over the world in the backward (one all-reduce) and divided by the world
size, so the step's gradient is the mean of the ranks' losses' gradients, as DDP makes it.
"""
from typing import Any, Optional

import torch

from mmsp._extension import C as _C


def _world_sum(x: torch.Tensor, world: Optional[Any], what: str) -> None:
    if world is None:
        return
    try:
        _C.all_reduce_(x, world)
    except ValueError as e:
        raise ValueError(f"mmsp: summing {what} over every rank: {e}") from None


class ToBatch(torch.autograd.Function):
    """values [k, N] (N labelled slots) -> [k, rows.count, width]: the exchange described above."""

    @staticmethod
    def forward(ctx: Any, values: torch.Tensor, index: torch.Tensor, sequences: int, width: int,
                rows: tuple[int, int], world: Optional[Any], world_size: int, per_rank: bool) -> torch.Tensor:
        k = values.shape[0]
        whole = values.new_zeros(k, sequences * width)
        whole[:, index] = values
        _world_sum(whole, world, f"the batch's per-token values ({k} x {sequences} x {width})")
        ctx.save_for_backward(index)
        ctx.shape, ctx.rows, ctx.world, ctx.world_size, ctx.per_rank = (k, sequences, width), rows, world, \
            world_size, per_rank
        first, count = rows
        return whole.view(k, sequences, width)[:, first:first + count].clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Optional[torch.Tensor], ...]:
        (index,) = ctx.saved_tensors
        k, sequences, width = ctx.shape
        if ctx.per_rank:  # each rank's loss read its own rows: every rank's gradients, averaged
            first, count = ctx.rows
            full = grad.new_zeros(k, sequences, width)
            full[:, first:first + count] = grad
            _world_sum(full, ctx.world, f"the per-token values' gradients ({k} x {sequences} x {width})")
            grad = full / ctx.world_size
        return grad.reshape(k, -1)[:, index], None, None, None, None, None, None, None


def batch_index(shard: Any, width: int, slots: torch.Tensor) -> torch.Tensor:
    """Flat positions in [sequences, width] of the labels the given slots predict."""
    return shard.sequence[slots] * width + shard.index_in_sequence[slots] + 1


def to_batch(values: torch.Tensor, shard: Any, slots: torch.Tensor, sequences: int, width: int, mesh: Any,
             rows: Optional[tuple[int, int]] = None, per_rank: bool = False) -> torch.Tensor:
    """values [k, N] of this rank's labelled `slots` -> [k, rows, width] of the step's batch
    (`sequences` sequences, the longest `width` tokens; `rows` (first, count): the rows this
    rank returns, all by default; per_rank: each rank's loss reads only its rows)."""
    world = mesh.world
    size = 1 if world is None else world.size
    index = batch_index(shard, width, slots).to(values.device)
    return ToBatch.apply(values, index, sequences, width, rows or (0, sequences), world, size, per_rank)
