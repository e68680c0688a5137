"""mmsp's sequence-parallel ops as torch.library custom ops (`torch.ops.mmsp.*`), so that
torch.compile traces a patched model through them, each a single node of the graph, never a
graph break.

Each op has a fake (meta) implementation, which gives its output's shape from its inputs'
alone, and autograd. The exchanges are linear, so their backward is the reverse exchange
(Ulysses' head scatter <-> gather, an all-to-all-v with the counts swapped). The context
attention's forward and backward are apart (attention/step_attention.h): its forward op
returns what its backward reads, and its backward op runs the kernels' and the ring's own
backward, the same code eager mmsp runs, once. Gated DeltaNet's conv and rule are LibTorch
autograd functions whose graph a custom op cannot carry from its forward to its backward;
their backward op runs the forward again with autograd on (the same collectives, in the
same order on every rank, exactly as checkpointing recomputes a layer) and backpropagates
through it: a compiled hybrid step costs one more forward of those two ops than eager. The
results are the same to the last bit of each op's own arithmetic.

Process groups are not values a graph can hold; an op names its groups by a string that
mmsp.Mesh registers here (`group_key`), as torch's functional collectives name theirs.
"""

from typing import Optional, Sequence

import torch
from torch.library import custom_op

from mmsp import op_agreement as _agreement
from mmsp._extension import C

_groups: dict[str, C.Group] = {}


def group_key(group: Optional[C.Group]) -> str:
    """The name ops take for `group` ("" for None: a one-rank axis). Registered for the
    process's life (a Mesh's groups live as long as it), unique within the process."""
    if group is None:
        return ""
    key = f"{group.name}#{len(_groups)}"
    _groups[key] = group
    return key


def _group(key: str) -> Optional[C.Group]:
    if not key:
        return None
    try:
        return _groups[key]
    except KeyError:
        raise ValueError(f"mmsp ops: no process group is registered as {key!r}; give the names a "
                         "mmsp.Mesh holds (mesh.op_groups)") from None


def _context(ring: Optional[C.Group], ulysses: Optional[C.Group]) -> list[Optional[C.Group]]:
    """The groups a context op agrees over: the context group (ring x Ulysses) that the Mesh
    registered beside them, so that one verdict holds for every rank the op's exchanges join."""
    if ring is None or ulysses is None:
        return [ring if ulysses is None else ulysses]
    members = set(ring.members) | set(ulysses.members)
    found: list[Optional[C.Group]] = [g for g in _groups.values()
                                      if g.size == len(members) and set(g.members) == members]
    return found[:1] or [ring, ulysses]


def _size(key: str) -> int:
    group = _group(key)
    return 1 if group is None else group.size


def _coords(key: str) -> int:
    """This rank's place in the group named `key` (0 for a one-rank axis)."""
    group = _group(key)
    return 0 if group is None else group.rank


class _WithAutograd:
    """Autograd kept on inside an op's kernel: a custom op's kernel runs below autograd (its
    dispatch keys excluded), which the recomputing backwards must undo to differentiate."""

    def __enter__(self) -> None:
        excluded = torch._C._dispatch_tls_local_exclude_set()
        for key in (torch._C.DispatchKey.AutogradFunctionality, torch._C.DispatchKey.ADInplaceOrView,
                    torch._C.DispatchKey.AutogradOther, torch._C.DispatchKey.AutogradNestedTensor):
            excluded = excluded.remove(key)
        self._force = torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), excluded)
        self._grad = torch.enable_grad()
        self._force.__enter__()
        self._grad.__enter__()

    def __exit__(self, *exc: object) -> None:
        self._grad.__exit__(*exc)
        self._force.__exit__(*exc)


def _recomputed_grads(forward, inputs: Sequence[torch.Tensor], grad: torch.Tensor) -> list[torch.Tensor]:
    """d(loss)/d(inputs) of `forward(*inputs)` given d(loss)/d(output), by running it again."""
    with _WithAutograd():
        leaves = [x.detach().requires_grad_(x.is_floating_point()) for x in inputs]
        out = forward(*leaves)
        wanted = [x for x in leaves if x.requires_grad]
        got = iter(torch.autograd.grad(out, wanted, grad, allow_unused=True))
    return [((g if (g := next(got)) is not None else torch.zeros_like(x)) if x.requires_grad
             else torch.zeros_like(x)).contiguous() for x in leaves]


def _empty(x: torch.Tensor) -> torch.Tensor:
    """A fake output like x, contiguous (as every kernel here returns its outputs)."""
    return x.new_empty(x.shape)


def _none_like(inputs: tuple) -> tuple:
    """No gradient for each input, shaped as autograd flattens the inputs: a list of tensors (an
    empty list counts as one) gets a list of Nones, anything else one None."""
    return tuple([None] * len(x) if isinstance(x, list) and all(isinstance(t, torch.Tensor) for t in x)
                 else None for x in inputs)


def _no_double_backward(ctx: object, *grads: torch.Tensor) -> None:
    raise RuntimeError("mmsp ops: a backward op of mmsp's is not differentiable (no double backward)")


def _no_context(ctx: object, inputs: tuple, output: object) -> None:
    pass


# ---- context attention -------------------------------------------------------------------
# Forward and backward apart (mmsp's step attention, attention/step_attention.h): the forward
# op returns the output and what the backward reads (the gathered q, k, v, the inner output
# and its log-sum-exp: what eager autograd saves), the backward op computes the gradients from
# them. A compiled step runs the same kernels and exchanges as eager, once each.

@custom_op("mmsp::context_attention", mutates_args=())
def context_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segments: list[torch.Tensor],
                      orders: list[torch.Tensor], ring: str, ulysses: str, causal: bool, scale: float,
                      split_slots: list[int]) -> list[torch.Tensor]:
    """mmsp.ops.attention's op: q [T, H, D], k/v [T, H_kv, D] -> [out [T, H, D], saved...]."""
    try:
        C.check_ulysses_heads(q.shape[1], k.shape[1], _size(ulysses))
        refused = None
    except ValueError as e:
        refused = str(e)
    _agreement.layout("context_attention", (q, k, v), segments, orders, _context(_group(ring), _group(ulysses)),
                      (causal, scale, split_slots), refused)
    return C.context_attention_forward(q, k, v, segments, orders, _group(ring), _group(ulysses), causal, scale,
                                       split_slots)


def _saved_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segments: list[torch.Tensor], ring: str,
                  ulysses: str, split_slots: list[int]) -> list[torch.Tensor]:
    """The saved tensors' fake shapes (as step_attention_forward makes them)."""
    U = _size(ulysses)
    rep = U // k.shape[1] if k.shape[1] < U else 1

    def part(tokens: int) -> list[torch.Tensor]:  # gathered q, k, v, the inner out and lse
        lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        return [q.new_empty(tokens, q.shape[1] // U, q.shape[2]),
                k.new_empty(tokens, k.shape[1] * rep // U, k.shape[2]),
                v.new_empty(tokens, v.shape[1] * rep // U, v.shape[2]),
                q.new_empty(tokens, q.shape[1] // U, v.shape[2]),
                q.new_empty(tokens, q.shape[1] // U, dtype=lse_dtype)]

    if not split_slots:
        return part(q.shape[0] * U)
    r, u = _coords(ring), _coords(ulysses)
    split = sum(split_slots[r * U:(r + 1) * U])
    a = split_slots[r * U + u]
    whole = q.shape[0] - a
    empty = [q.new_empty(0)] * 5
    return (part(split) if split else empty) + \
        ([q.new_empty(whole, *q.shape[1:]), k.new_empty(whole, *k.shape[1:]), v.new_empty(whole, *v.shape[1:]),
          q.new_empty(whole, q.shape[1], v.shape[2]),
          q.new_empty(whole, q.shape[1], dtype=torch.float64 if q.dtype == torch.float64 else torch.float32)]
         if whole else empty)


@context_attention.register_fake
def _(q, k, v, segments, orders, ring, ulysses, causal, scale, split_slots):
    return [q.new_empty(q.shape[0], q.shape[1], v.shape[2])] + _saved_shapes(q, k, v, segments, ring, ulysses,
                                                                              split_slots)


@custom_op("mmsp::context_attention_backward", mutates_args=())
def context_attention_backward(grad: torch.Tensor, saved: list[torch.Tensor], kv_heads: int,
                               segments: list[torch.Tensor], orders: list[torch.Tensor], ring: str, ulysses: str,
                               causal: bool, scale: float,
                               split_slots: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of context_attention from what its forward saved: no forward again."""
    dq, dk, dv = C.context_attention_backward(grad, saved, kv_heads, segments, orders, _group(ring),
                                              _group(ulysses), causal, scale, split_slots)
    return dq, dk, dv


@context_attention_backward.register_fake
def _(grad, saved, kv_heads, segments, orders, ring, ulysses, causal, scale, split_slots):
    # q, k and v share the head size (mmsp's attention checks it)
    return grad.new_empty(grad.shape), grad.new_empty(grad.shape[0], kv_heads, grad.shape[2]), \
        grad.new_empty(grad.shape[0], kv_heads, grad.shape[2])


def _attention_context(ctx, inputs, output):
    q, k, v, segments, orders, *rest = inputs
    ctx.save_for_backward(*output[1:], *segments, *orders)
    ctx.saved_count, ctx.shares, ctx.kv_heads = len(output) - 1, len(segments), k.shape[1]
    ctx.rest = rest
    ctx.nones = _none_like(inputs[3:])


def _attention_backward(ctx, grads):
    # The op returns a list (the output, then what the backward reads): its gradients come as one
    # list; the saved tensors' are not the model's (they feed nothing but this backward).
    grad = grads[0]
    tensors = ctx.saved_tensors
    n, s = ctx.saved_count, ctx.shares
    saved, layouts = list(tensors[:n]), tensors[n:]
    dq, dk, dv = torch.ops.mmsp.context_attention_backward(grad, saved, ctx.kv_heads, layouts[:s], layouts[s:],
                                                           *ctx.rest)
    return dq, dk, dv, *ctx.nones


context_attention.register_autograd(_attention_backward, setup_context=_attention_context)
context_attention_backward.register_autograd(_no_double_backward, setup_context=_no_context)


# ---- Gated DeltaNet: the conv and the rule ------------------------------------------------

@custom_op("mmsp::gated_delta_conv", mutates_args=())
def gated_delta_conv(x: torch.Tensor, weight: torch.Tensor, segments: list[torch.Tensor],
                     orders: list[torch.Tensor], ring: str) -> torch.Tensor:
    """mmsp.ops.gated_delta_conv's op: x [T_r, C], weight [C, W] -> [T_r, C]."""
    _agreement.layout("gated_delta_conv", (x, weight), segments, orders, [_group(ring)], (),
                      _agreement.share_tokens("gated_delta_conv", x.shape[0], segments, _group(ring)))
    return C.gated_delta_conv(x, weight, segments, orders, _group(ring)).contiguous()


@gated_delta_conv.register_fake
def _(x, weight, segments, orders, ring):
    return _empty(x)


@custom_op("mmsp::gated_delta_conv_backward", mutates_args=())
def gated_delta_conv_backward(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                              segments: list[torch.Tensor], orders: list[torch.Tensor],
                              ring: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dweight) of gated_delta_conv by recomputing it."""
    dx, dw = _recomputed_grads(lambda x_, w_: C.gated_delta_conv(x_, w_, segments, orders, _group(ring)),
                               (x, weight), grad)
    return dx, dw


@gated_delta_conv_backward.register_fake
def _(grad, x, weight, segments, orders, ring):
    return _empty(x), _empty(weight)


def _conv_context(ctx, inputs, output):
    x, weight, segments, orders, ring = inputs
    ctx.save_for_backward(x, weight, *segments, *orders)
    ctx.shares, ctx.ring = len(segments), ring
    ctx.nones = _none_like(inputs[2:])


def _conv_backward(ctx, grad):
    x, weight, *layouts = ctx.saved_tensors
    n = ctx.shares
    dx, dw = torch.ops.mmsp.gated_delta_conv_backward(grad, x, weight, layouts[:n], layouts[n:], ctx.ring)
    return dx, dw, *ctx.nones


gated_delta_conv.register_autograd(_conv_backward, setup_context=_conv_context)
gated_delta_conv_backward.register_autograd(_no_double_backward, setup_context=_no_context)


@custom_op("mmsp::gated_delta_rule", mutates_args=())
def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     segments: list[torch.Tensor], orders: list[torch.Tensor], ring: str,
                     chunk: int) -> torch.Tensor:
    """mmsp.ops.gated_delta_rule's op: q, k [T_r, H, K], v [T_r, H, V], g, beta [T_r, H] -> [T_r, H, V]."""
    _agreement.layout("gated_delta_rule", (q, k, v, g, beta), segments, orders, [_group(ring)], (chunk,),
                      _agreement.share_tokens("gated_delta_rule", q.shape[0], segments, _group(ring)))
    return C.gated_delta_rule(q, k, v, g, beta, segments, orders, _group(ring), chunk).contiguous()


@gated_delta_rule.register_fake
def _(q, k, v, g, beta, segments, orders, ring, chunk):
    return _empty(v)


@custom_op("mmsp::gated_delta_rule_backward", mutates_args=())
def gated_delta_rule_backward(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                              g: torch.Tensor, beta: torch.Tensor, segments: list[torch.Tensor],
                              orders: list[torch.Tensor], ring: str,
                              chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                   torch.Tensor]:
    """(dq, dk, dv, dg, dbeta) of gated_delta_rule by recomputing it."""
    dq, dk, dv, dg, dbeta = _recomputed_grads(
        lambda q_, k_, v_, g_, b_: C.gated_delta_rule(q_, k_, v_, g_, b_, segments, orders, _group(ring), chunk),
        (q, k, v, g, beta), grad)
    return dq, dk, dv, dg, dbeta


@gated_delta_rule_backward.register_fake
def _(grad, q, k, v, g, beta, segments, orders, ring, chunk):
    return tuple(_empty(x) for x in (q, k, v, g, beta))


def _rule_context(ctx, inputs, output):
    q, k, v, g, beta, segments, orders, ring, chunk = inputs
    ctx.save_for_backward(q, k, v, g, beta, *segments, *orders)
    ctx.shares, ctx.ring, ctx.chunk = len(segments), ring, chunk
    ctx.nones = _none_like(inputs[5:])


def _rule_backward(ctx, grad):
    q, k, v, g, beta, *layouts = ctx.saved_tensors
    n = ctx.shares
    grads = torch.ops.mmsp.gated_delta_rule_backward(grad, q, k, v, g, beta, layouts[:n], layouts[n:], ctx.ring,
                                                     ctx.chunk)
    return (*grads, *ctx.nones)


gated_delta_rule.register_autograd(_rule_backward, setup_context=_rule_context)
gated_delta_rule_backward.register_autograd(_no_double_backward, setup_context=_no_context)


# ---- the exchanges: Ulysses' heads, Vision DP's rows -------------------------------------

@custom_op("mmsp::ulysses_scatter_heads", mutates_args=())
def ulysses_scatter_heads(x: torch.Tensor, tokens: list[int], ulysses: str) -> torch.Tensor:
    """[tokens[u], H, F] -> [sum(tokens), H/U, F] (mmsp.ops.ulysses_scatter_heads)."""
    group = _group(ulysses)
    if group is not None:
        _agreement.heads("ulysses_scatter_heads", x, tokens, group)
    return (x.clone() if group is None else C.ulysses_scatter_heads(x, tokens, group)).contiguous()


@ulysses_scatter_heads.register_fake
def _(x, tokens, ulysses):
    return x.new_empty(sum(tokens), x.shape[1] // _size(ulysses), *x.shape[2:])


@custom_op("mmsp::ulysses_gather_heads", mutates_args=())
def ulysses_gather_heads(y: torch.Tensor, tokens: list[int], ulysses: str) -> torch.Tensor:
    """The inverse of ulysses_scatter_heads: [sum(tokens), H/U, F] -> [tokens[u], H, F]."""
    group = _group(ulysses)
    if group is not None:
        _agreement.heads("ulysses_gather_heads", y, tokens, group)
    return (y.clone() if group is None else C.ulysses_gather_heads(y, tokens, group)).contiguous()


@ulysses_gather_heads.register_fake
def _(y, tokens, ulysses):
    group = _group(ulysses)
    return y.new_empty(tokens[group.rank] if group is not None else sum(tokens), y.shape[1] * _size(ulysses),
                       *y.shape[2:])


def _heads_context(ctx, inputs, output):
    ctx.tokens, ctx.ulysses = inputs[1], inputs[2]
    ctx.nones = _none_like(inputs[1:])


ulysses_scatter_heads.register_autograd(
    lambda ctx, grad: (torch.ops.mmsp.ulysses_gather_heads(grad, ctx.tokens, ctx.ulysses), *ctx.nones),
    setup_context=_heads_context)
ulysses_gather_heads.register_autograd(
    lambda ctx, grad: (torch.ops.mmsp.ulysses_scatter_heads(grad, ctx.tokens, ctx.ulysses), *ctx.nones),
    setup_context=_heads_context)


@custom_op("mmsp::all_to_all_v", mutates_args=())
def all_to_all_v(rows: torch.Tensor, send_counts: list[int], recv_counts: list[int], group: str) -> torch.Tensor:
    """Rows to the group's ranks by counts (Vision DP's routes, mmsp.ops.route_rows)."""
    g = _group(group)
    if g is not None:
        _agreement.rows(rows, send_counts, recv_counts, g)
    return (rows.clone() if g is None else C.all_to_all_v(rows, send_counts, recv_counts, g)).contiguous()


@all_to_all_v.register_fake
def _(rows, send_counts, recv_counts, group):
    return rows.new_empty(sum(recv_counts), *rows.shape[1:])


def _rows_context(ctx, inputs, output):
    ctx.send, ctx.recv, ctx.group = inputs[1], inputs[2], inputs[3]
    ctx.nones = _none_like(inputs[1:])


all_to_all_v.register_autograd(
    lambda ctx, grad: (torch.ops.mmsp.all_to_all_v(grad, ctx.recv, ctx.send, ctx.group), *ctx.nones),
    setup_context=_rows_context)
