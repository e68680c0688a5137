"""mmsp's sequence-parallel ops on torch tensors, exact (equal to one process) forward and backward.

Every op takes this rank's slots of a step (a Shard's layout) and the Mesh; every rank of
the context group must call the same ops in the same order (they run collectives), also in
the backward, which autograd does for you. Inputs are checked before the first collective;
a wrong input is a ValueError naming the value and the rule, on every rank of the op's group:
the ranks agree on each call first (mmsp.op_agreement: one small all-reduce a call), so a rank
whose call differs or whose input is refused stops every rank, never one alone.

Eager, each op is one LibTorch autograd call. Under torch.compile (dynamo tracing), each goes
through its torch.library custom op instead (mmsp.library, `torch.ops.mmsp.*`): one node of
the graph with a fake implementation, whose backward recomputes the attention and Gated
DeltaNet ops' forward (the results are equal; the compiled step does that work twice).
"""

from typing import TYPE_CHECKING, Optional, Sequence

import torch

from mmsp import library  # noqa: F401  (registers torch.ops.mmsp)
from mmsp import op_agreement as _agreement
from mmsp._extension import C

if TYPE_CHECKING:
    from mmsp.mesh import Mesh
    from mmsp.planner import Shard


def _split_slots(shard: "Shard") -> list[int]:
    return list(shard.split_slots) if shard.split_slots else []


def _compiling() -> bool:
    return torch.compiler.is_compiling()


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shard: "Shard", mesh: "Mesh", *,
              causal: bool = True, scale: Optional[float] = None) -> torch.Tensor:
    """Attention over the context group: q [T, H, D], k/v [T, H_kv, D] of this rank's slots.

    The scheme follows the mesh: local (one rank), Ulysses (heads exchanged), zigzag ring
    (K/V passed round, merged by log-sum-exp) or hybrid (Ulysses inside each ring rank). Packed
    sequences never attend across; causal by token order; GQA when H_kv divides H.
    """
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"mmsp.ops.attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} "
                         "must be [tokens, heads, head_dim]")
    if _compiling():
        return torch.ops.mmsp.context_attention(q, k, v, list(shard.segments), list(shard.orders),
                                                mesh.op_groups["ring"], mesh.op_groups["ulysses"], causal,
                                                0.0 if scale is None else float(scale), _split_slots(shard))[0]
    _agree_attention(q, k, v, shard.segments, shard.orders, mesh.ulysses_size, [mesh.context],
                     (causal, scale, _split_slots(shard)))
    return C.context_attention(q, k, v, shard.segments, shard.orders, mesh.ring, mesh.ulysses, causal,
                               0.0 if scale is None else float(scale), _split_slots(shard))


def _agree_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segments: Sequence[torch.Tensor],
                     orders: Sequence[torch.Tensor], ulysses: int, groups: Sequence[Optional[C.Group]],
                     options: tuple) -> None:
    """The attention's own checks (this rank's), then the call agreed over its context group."""
    try:
        C.check_ulysses_heads(q.shape[1], k.shape[1], ulysses)
        refused = None
    except ValueError as e:
        refused = str(e)
    _agreement.layout("context_attention", (q, k, v), segments, orders, groups, options, refused)


def gated_delta_conv(x: torch.Tensor, weight: torch.Tensor, shard: "Shard", mesh: "Mesh") -> torch.Tensor:
    """Gated DeltaNet's causal depthwise conv + SiLU over each segment: x [T_r, C] is this
    ring rank's whole share (with Ulysses > 1: after ulysses_scatter_heads), weight [C, W].

    The W - 1 tokens before a ring rank's first token of a segment come from the rank that
    holds them (the ring's conv context)."""
    if _compiling():
        return torch.ops.mmsp.gated_delta_conv(x, weight, list(shard.segments), list(shard.orders),
                                               mesh.op_groups["ring"])
    refused = _agreement.share_tokens("gated_delta_conv", x.shape[0], shard.segments, mesh.ring)
    _agreement.layout("gated_delta_conv", (x, weight), shard.segments, shard.orders, [mesh.ring], (), refused)
    return C.gated_delta_conv(x, weight, shard.segments, shard.orders, mesh.ring)


def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     shard: "Shard", mesh: "Mesh", *, chunk: int = 64) -> torch.Tensor:
    """The gated delta rule, chunked, with ring state passing, on this ring rank's whole share
    (with Ulysses > 1: after ulysses_scatter_heads): q, k [T_r, H, K] (L2-normalised),
    v [T_r, H, V], g (log decay <= 0) and beta [T_r, H] -> o [T_r, H, V]."""
    if _compiling():
        return torch.ops.mmsp.gated_delta_rule(q, k, v, g, beta, list(shard.segments), list(shard.orders),
                                               mesh.op_groups["ring"], chunk)
    refused = _agreement.share_tokens("gated_delta_rule", q.shape[0], shard.segments, mesh.ring)
    _agreement.layout("gated_delta_rule", (q, k, v, g, beta), shard.segments, shard.orders, [mesh.ring], (chunk,),
                      refused)
    return C.gated_delta_rule(q, k, v, g, beta, shard.segments, shard.orders, mesh.ring, chunk)


def ulysses_scatter_heads(x: torch.Tensor, tokens: Sequence[int], mesh: "Mesh") -> torch.Tensor:
    """[tokens[u], H, F] -> [sum(tokens), H/U, F]: head group p of my tokens to Ulysses rank p."""
    if mesh.ulysses_size == 1:
        return x
    if _compiling():
        return torch.ops.mmsp.ulysses_scatter_heads(x, list(tokens), mesh.op_groups["ulysses"])
    assert mesh.ulysses is not None, "a Mesh of Ulysses size > 1 holds its Ulysses group"
    _agreement.heads("ulysses_scatter_heads", x, tokens, mesh.ulysses)
    return C.ulysses_scatter_heads(x, list(tokens), mesh.ulysses)


def ulysses_gather_heads(y: torch.Tensor, tokens: Sequence[int], mesh: "Mesh") -> torch.Tensor:
    """The inverse of ulysses_scatter_heads."""
    if mesh.ulysses_size == 1:
        return y
    if _compiling():
        return torch.ops.mmsp.ulysses_gather_heads(y, list(tokens), mesh.op_groups["ulysses"])
    assert mesh.ulysses is not None, "a Mesh of Ulysses size > 1 holds its Ulysses group"
    _agreement.heads("ulysses_gather_heads", y, tokens, mesh.ulysses)
    return C.ulysses_gather_heads(y, list(tokens), mesh.ulysses)


def route_rows(rows: torch.Tensor, shard: "Shard", mesh: "Mesh") -> tuple[torch.Tensor, torch.Tensor]:
    """Vision DP's exchange: `rows` [encoder_rows, F] are this rank's encoder output for
    shard.encoder_items (in that order); returns (the rows this rank's placeholder slots
    receive [V, F], their slots [V]) over the context group, by the plan's routes."""
    send = [r["src_row"] for dst in shard.send for r in dst]
    slots = torch.tensor([r["slot"] for src in shard.recv for r in src], dtype=torch.long)
    picked = rows.index_select(0, torch.tensor(send, dtype=torch.long, device=rows.device))
    if mesh.context is None:
        return picked, slots
    if _compiling():
        return torch.ops.mmsp.all_to_all_v(picked, [len(d) for d in shard.send], [len(s) for s in shard.recv],
                                           mesh.op_groups["context"]), slots
    send, recv = [len(d) for d in shard.send], [len(s) for s in shard.recv]
    _agreement.rows(picked, send, recv, mesh.context)
    return C.all_to_all_v(picked, send, recv, mesh.context), slots
