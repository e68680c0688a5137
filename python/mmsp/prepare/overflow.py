"""`--max-length N`: a sample longer than N tokens is refused, or cut (`--overflow truncate`).

A cut keeps the first N tokens, moved back to the start of any image or video block it would
fall in: a block is whole or gone (the trainer checks each block's placeholders against its
grid), and the items whose blocks are gone leave the sample. Whole trailing turns, and the tail
of the turn that crosses N, go with it.
"""
from typing import Optional

from .errors import BadSample
from .grids import Block

OVERFLOW = ("refuse", "truncate")


def fit(ids: list[int], mask: list[int], blocks: list[Block], max_length: Optional[int],
        overflow: str) -> tuple[list[int], list[int], list[Block]]:
    """Returns (ids, mask, blocks) within `max_length` tokens, or raises `BadSample`."""
    if max_length is None or len(ids) <= max_length:
        return ids, mask, blocks
    if overflow == "refuse":
        raise BadSample(f"{len(ids)} tokens, more than --max-length {max_length} (--overflow truncate cuts it)")
    cut = max_length
    for b in blocks:
        if b.start < cut < b.end:
            cut = b.start
    kept = [b for b in blocks if b.end <= cut]
    if not any(mask[:cut]):
        first = mask.index(1) if 1 in mask else len(mask)
        raise BadSample(f"{len(ids)} tokens cut to {cut} for --max-length {max_length} leave no target token "
                        f"(the first is token {first})")
    return ids[:cut], mask[:cut], kept
