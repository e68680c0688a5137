"""The RL losses' input checks: shapes against the per-token log-probs, NaN and infinities
where a value is read, each named by its field and row; agreed over the mesh when one is given
(a rank that refuses stops every rank before the backward's exchange)."""
from typing import Any, Optional

import torch
import torch.distributed as dist


def check_per_token(name: str, value: torch.Tensor, shape: tuple[int, ...], mask: Optional[torch.Tensor],
                    per_row_ok: bool = False) -> Optional[str]:
    """`value` must be [B, T] (or [B] with per_row_ok) and finite where `mask` holds; the first
    violation as a message naming the field and the row, else None."""
    B = shape[0]
    if tuple(value.shape) != tuple(shape) and not (per_row_ok and tuple(value.shape) == (B,)):
        want = f"{list(shape)}" + (f" or [{B}] (one per sequence)" if per_row_ok else "")
        return f"{name} has shape {list(value.shape)}; it must be {want}, as the per-token log-probs"
    bad = ~torch.isfinite(value.detach())
    if mask is not None and value.dim() == 2:
        bad &= mask.bool()
    if value.dim() == 1 and mask is not None:
        bad &= mask.bool().any(-1)  # a row without labelled tokens reads no advantage
    if not bad.any():
        return None
    where = bad.nonzero()[0].tolist()
    at = f"row {where[0]}" + (f", token {where[1]}" if len(where) > 1 else "")
    return f"{name} is {value.detach()[tuple(where)].item()} at {at} (sample {where[0]} of the batch); " \
           "every value the loss reads must be finite"


def raise_agreed(errors: list[Optional[str]], what: str, mesh: Optional[Any]) -> None:
    """Raises the first error as a ValueError; with `mesh`, on every rank when any rank has one."""
    mine = next((e for e in errors if e is not None), None)
    world = None if mesh is None else getattr(mesh, "world_group", None)
    if world is None:
        if mine is not None:
            raise ValueError(f"{what}: {mine}")
        return
    theirs: list[Optional[str]] = [None] * dist.get_world_size(world)
    dist.all_gather_object(theirs, mine, group=world)
    bad = [(r, e) for r, e in enumerate(theirs) if e is not None]
    if bad:
        raise ValueError(f"{what}: " + "; ".join(f"rank {r}: {e}" for r, e in bad))
