"""Every rank of a group agrees on an op's call before the op's payload moves.

mmsp's C++ collectives trust that every rank of a group calls alike: the same op, with counts
and shapes that fit together. A rank whose call differs (other counts to all_to_all_v, another
tokens list to Ulysses' head exchange, inputs only it refuses) would otherwise enter the
exchange alone (the others wait out the group's timeout) or send what its peers do not expect
(Gloo aborts the process: SIGABRT). So each op of mmsp.ops and torch.ops.mmsp first exchanges
one fixed-size int64 table over its group, one row a rank: the op called, whether this rank
refused its inputs (its local checks), a 64-bit word of what must be equal on every rank
(dtype, trailing shapes, the plan's layout, options) and the op's counts; every rank then reads
the same table and raises the same ValueError, naming the ranks, before any payload moves.
The table is the same size for every op of a group, so ranks that call different ops still
exchange alike.

Cost: one small all-reduce (and, on a GPU, one device synchronisation) per op call. mmsp.patch
agrees on the whole step once (its batch and model check), so its layers skip it (`agreed()`).
"""

import hashlib
import threading
from contextlib import contextmanager
from typing import Iterator, Optional, Sequence

import torch

from mmsp._extension import C

OPS = ("context_attention", "gated_delta_conv", "gated_delta_rule", "ulysses_scatter_heads", "ulysses_gather_heads",
       "all_to_all_v")
_HEAD = 3  # columns before the counts: the op, refused, the word of what must be equal
_COUNT_MAX = 1 << 62
_state = threading.local()


@contextmanager
def agreed() -> Iterator[None]:
    """Within it the ops skip their agreement: the caller (mmsp.patch) has agreed the whole step."""
    before = getattr(_state, "agreed", False)
    _state.agreed = True
    try:
        yield
    finally:
        _state.agreed = before


def word(*values: object) -> int:
    """A 64-bit word of values (tensors by their bytes, the rest by repr)."""
    h = hashlib.blake2b(digest_size=8)
    for v in values:
        if isinstance(v, torch.Tensor):
            t = v.detach().cpu().contiguous()
            h.update(repr((str(t.dtype), tuple(t.shape))).encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            h.update(repr(v).encode())
        h.update(b"\0")
    return int.from_bytes(h.digest(), "little", signed=True)


def _ranks(group: "C.Group", ranks: Sequence[int]) -> str:
    names = [str(group.members[r]) for r in ranks]
    return ("rank " if len(names) == 1 else "ranks ") + ", ".join(names)


def agree(op: str, group: Optional["C.Group"], device: torch.device, same: tuple, what_same: str,
          refused: Optional[str] = None, counts: Optional[tuple[Sequence[int], Sequence[int]]] = None) -> None:
    """Agrees `op`'s call over `group` (nothing to agree on a one-rank group or inside agreed());
    raises this rank's `refused` (its own check's message), or the group's disagreement, as a
    ValueError on every rank. `same`: what every rank must hold alike (`what_same` names it);
    `counts`: (send, recv) of an all-to-all-v, checked to fit (rank i's send[j] = rank j's recv[i])."""
    if group is None or group.size == 1 or getattr(_state, "agreed", False):
        if refused is not None:
            raise ValueError(refused)
        return
    P, me = group.size, group.rank
    table = torch.zeros(P, _HEAD + 2 * P, dtype=torch.int64)
    row = [OPS.index(op) + 1, int(refused is not None), word(*same)]
    if counts is not None and refused is None:
        row += [int(c) for c in counts[0]] + [int(c) for c in counts[1]]
    table[me, :len(row)] = torch.tensor(row, dtype=torch.int64)
    where = f"mmsp.ops.{op} on group {group.name} ({P} ranks)"
    table = table.to(device)  # where the group moves the op's tensors (Gloo: CPU, NCCL: CUDA)
    try:
        C.all_reduce_(table, group)
    except ValueError as e:
        raise ValueError(f"{where}: agreeing on the call before its exchange: {e}") from None
    _check(table.tolist(), group, where, what_same, refused)


def _check(rows: list[list[int]], group: "C.Group", where: str, what_same: str, refused: Optional[str]) -> None:
    P, stop = group.size, "stopped before the exchange, on every rank of the group"
    by_op: dict[int, list[int]] = {}
    for r, row in enumerate(rows):
        by_op.setdefault(row[0], []).append(r)
    if len(by_op) > 1:
        called = "; ".join(f"{_ranks(group, rs)} called {OPS[c - 1] if 0 < c <= len(OPS) else '?'}"
                           for c, rs in by_op.items())
        raise ValueError(f"{where}: the ranks called different ops here ({called}); every rank of a group calls the "
                         f"same ops in the same order; {stop}")
    refusers = [r for r in range(P) if rows[r][1]]
    if refused is not None:
        raise ValueError(f"{refused} (on {_ranks(group, [group.rank])}; {stop})")
    if refusers:
        raise ValueError(f"{where}: {_ranks(group, refusers)} refused {'its' if len(refusers) == 1 else 'their'} "
                         f"inputs (its own error says why); {stop}")
    by_word: dict[int, list[int]] = {}
    for r, row in enumerate(rows):
        by_word.setdefault(row[2], []).append(r)
    if len(by_word) > 1:
        groups = " / ".join(_ranks(group, rs) for rs in by_word.values())
        raise ValueError(f"{where}: the ranks' {what_same} differ ({groups} hold different ones); every rank must call "
                         f"it alike; {stop}")
    for i in range(P):
        for j in range(P):
            sent, expected = rows[i][_HEAD + j], rows[j][_HEAD + P + i]
            if sent != expected:
                raise ValueError(f"{where}: {_ranks(group, [i])} sends {_ranks(group, [j])} {sent} rows but "
                                 f"{_ranks(group, [j])} expects {expected} from it (send_counts[j] on rank i must "
                                 f"equal recv_counts[i] on rank j); {stop}")


def check_counts(send: Sequence[int], recv: Sequence[int], rows: int, group: "C.Group") -> Optional[str]:
    """This rank's own checks of an all-to-all-v's counts: None, or why it refuses."""
    P, me = group.size, group.rank
    where = f"mmsp.ops.all_to_all_v on group {group.name}"
    if len(send) != P or len(recv) != P:
        return f"{where}: {len(send)} send and {len(recv)} receive counts for a group of {P}"
    if any(not 0 <= int(c) < _COUNT_MAX for c in list(send) + list(recv)):
        return f"{where}: counts {list(send)} and {list(recv)} must be in [0, 2^62)"
    if sum(send) != rows:
        return f"{where}: {rows} rows for send counts summing to {sum(send)}"
    if send[me] != recv[me]:
        return f"{where}: this rank sends itself {send[me]} rows but expects {recv[me]}"
    return None


def check_heads(op: str, t: torch.Tensor, tokens: Sequence[int], group: "C.Group") -> Optional[str]:
    """This rank's own checks of Ulysses' head exchange: None, or why it refuses."""
    U, where = group.size, f"mmsp.ops.{op} on group {group.name}"
    if len(tokens) != U or any(int(n) < 0 for n in tokens):
        return f"{where}: tokens {list(tokens)} must hold one count >= 0 for each of the {U} Ulysses ranks"
    if t.dim() < 2:
        return f"{where}: the tensor {tuple(t.shape)} must be [tokens, heads, ...]"
    scatter = op == "ulysses_scatter_heads"
    want = tokens[group.rank] if scatter else sum(tokens)
    if t.shape[0] != want:
        return (f"{where}: the tensor has {t.shape[0]} tokens but "
                + (f"tokens[{group.rank}] (this rank's) is {want}" if scatter else f"tokens sum to {want}"))
    if scatter and t.shape[1] % U:
        return f"{where}: ulysses degree {U} must divide the heads ({t.shape[1]})"
    return None


# ---- each op's agreement: its own checks, what must be equal, its counts ------------------

def heads(op: str, t: torch.Tensor, tokens: Sequence[int], group: "C.Group") -> None:
    """Ulysses' head exchange (scatter or gather): the tokens list, dtype and trailing shape alike."""
    agree(op, group, t.device, (str(t.dtype), tuple(t.shape[1:]), [int(n) for n in tokens]),
          "dtypes, trailing shapes or tokens lists", check_heads(op, t, tokens, group))


def rows(rows_: torch.Tensor, send: Sequence[int], recv: Sequence[int], group: "C.Group") -> None:
    """An all-to-all-v: counts that fit together, and the rows' dtype and trailing shape alike."""
    refused = check_counts(send, recv, rows_.shape[0] if rows_.dim() else -1, group)
    agree("all_to_all_v", group, rows_.device, (str(rows_.dtype), tuple(rows_.shape[1:])),
          "row dtypes or trailing shapes", refused, (send, recv))


def layout(op: str, tensors: Sequence[torch.Tensor], segments: Sequence[torch.Tensor],
           orders: Sequence[torch.Tensor], groups: Sequence[Optional["C.Group"]], options: tuple,
           refused: Optional[str]) -> None:
    """An op on the plan's layout (attention, Gated DeltaNet's conv and rule), over each of its
    groups: dtypes, trailing shapes, the layout (every ring rank's share) and the options alike."""
    same = (tuple((str(t.dtype), tuple(t.shape[1:])) for t in tensors), word(*segments, *orders), options)
    device = tensors[0].device
    for group in groups:
        agree(op, group, device, same, "dtypes, trailing shapes, layouts or options", refused)
    if refused is not None:  # no group of more than one rank: this rank's own error
        raise ValueError(refused)


def share_tokens(op: str, tokens: int, segments: Sequence[torch.Tensor], ring: Optional["C.Group"]) -> Optional[str]:
    """A ring op's own check: this ring rank's tokens are its share of the layout."""
    R, r = (1, 0) if ring is None else (ring.size, ring.rank)
    if len(segments) != R:
        return f"mmsp.ops.{op}: {len(segments)} ring shares for a ring group of {R} ranks; give every ring rank's share"
    if segments[r].dim() != 1 or segments[r].shape[0] != tokens:
        return f"mmsp.ops.{op}: the input has {tokens} tokens but this ring rank's share has {segments[r].numel()}"
    return None
