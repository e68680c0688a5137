"""mmsp's sequence-parallel ops on torch tensors, exact (equal to one process) forward and backward.

Every op takes this rank's slots of a step (a Shard's layout) and the Mesh; every rank of
the context group must call the same ops in the same order (they run collectives), also in
the backward, which autograd does for you. Inputs are checked before the first collective;
a wrong input is a ValueError naming the value and the rule.
"""

from mmsp._extension import C


def _split_slots(shard):
    return list(shard.split_slots) if shard.split_slots else []


def attention(q, k, v, shard, mesh, *, causal=True, scale=None):
    """Attention over the context group: q [T, H, D], k/v [T, H_kv, D] of this rank's slots.

    The scheme follows the mesh: local (one rank), Ulysses (heads exchanged), zigzag ring
    (K/V passed round, merged by log-sum-exp) or hybrid (Ulysses inside each ring rank). Packed
    sequences never attend across; causal by token order; GQA when H_kv divides H.
    """
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"mmsp.ops.attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} "
                         "must be [tokens, heads, head_dim]")
    C.check_ulysses_heads(q.shape[1], k.shape[1], mesh.ulysses_size)
    return C.context_attention(q, k, v, shard.segments, shard.orders, mesh.ring, mesh.ulysses, causal,
                               0.0 if scale is None else float(scale), _split_slots(shard))


def gated_delta_conv(x, weight, shard, mesh):
    """Gated DeltaNet's causal depthwise conv + SiLU over each segment: x [T_r, C] is this
    ring rank's whole share (with Ulysses > 1: after ulysses_scatter_heads), weight [C, W].

    The W - 1 tokens before a ring rank's first token of a segment come from the rank that
    holds them (the ring's conv context)."""
    return C.gated_delta_conv(x, weight, shard.segments, shard.orders, mesh.ring)


def gated_delta_rule(q, k, v, g, beta, shard, mesh, *, chunk=64):
    """The gated delta rule, chunked, with ring state passing, on this ring rank's whole share
    (with Ulysses > 1: after ulysses_scatter_heads): q, k [T_r, H, K] (L2-normalised),
    v [T_r, H, V], g (log decay <= 0) and beta [T_r, H] -> o [T_r, H, V]."""
    return C.gated_delta_rule(q, k, v, g, beta, shard.segments, shard.orders, mesh.ring, chunk)


def ulysses_scatter_heads(x, tokens, mesh):
    """[tokens[u], H, F] -> [sum(tokens), H/U, F]: head group p of my tokens to Ulysses rank p."""
    if mesh.ulysses is None:
        return x
    return C.ulysses_scatter_heads(x, list(tokens), mesh.ulysses)


def ulysses_gather_heads(y, tokens, mesh):
    """The inverse of ulysses_scatter_heads."""
    if mesh.ulysses is None:
        return y
    return C.ulysses_gather_heads(y, list(tokens), mesh.ulysses)


def route_rows(rows, shard, mesh):
    """Vision DP's exchange: `rows` [encoder_rows, F] are this rank's encoder output for
    shard.encoder_items (in that order); returns (the rows this rank's placeholder slots
    receive [V, F], their slots [V]) over the context group, by the plan's routes."""
    import torch

    send = [r["src_row"] for dst in shard.send for r in dst]
    slots = torch.tensor([r["slot"] for src in shard.recv for r in src], dtype=torch.long)
    picked = rows.index_select(0, torch.tensor(send, dtype=torch.long, device=rows.device))
    if mesh.context is None:
        return picked, slots
    return C.all_to_all_v(picked, [len(d) for d in shard.send], [len(s) for s in shard.recv], mesh.context), slots
