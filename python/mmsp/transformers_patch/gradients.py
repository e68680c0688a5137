"""The gradients of a patched step: each rank's backward gives its tokens' part of every
gradient, and the parts are summed over the world — by mmsp at the end of the backward (one
all-reduce per dtype), or by FSDP2's reduce-scatter set to a sum. Accumulation over several
backwards (or several losses summed into one) adds each backward's parts once."""

import torch

from mmsp._extension import C as _C
from mmsp.transformers_patch.state import PatchState


def at_backward_start(state: PatchState) -> None:
    """Runs when a backward reaches the first patched loss, before any of its gradients
    accumulate (every path to a weight passes through a loss). The gradients earlier
    backwards left (accumulation) step aside, so that the sum over the mesh at the end of this
    backward adds this backward's parts only, each once; then they are added back. A backward
    through several patched losses (summed micro-batches) does this once."""
    state.pending = False
    if state.backward is not None:
        return
    state.backward = [p.grad for p in state.params]
    for p in state.params:
        p.grad = None
    torch.autograd.Variable._execution_engine.queue_callback(lambda: sum_gradients(state))


def sum_gradients(state: PatchState) -> None:
    """At the end of the backward: this backward's parts summed over the world (one
    all-reduce per dtype, mmsp's, on the mesh's world group: a stopped or dead peer ends it
    within the mesh's timeout, naming the group), plus what the earlier backwards held."""
    held, state.backward = state.backward, None
    params, world = state.params, state.mesh.world
    state.params = []  # not held between steps: FSDP2 may replace them
    # zeros for a weight this rank's slots never reached (e.g. no image here)
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    by_dtype: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for g in grads:
        by_dtype.setdefault((g.dtype, g.device), []).append(g)
    for group in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in group])
        world_sum(flat, world, f"the gradients ({flat.numel():,} {str(flat.dtype).removeprefix('torch.')} values)")
        at = 0
        for g in group:
            n = g.numel()
            g.copy_(flat[at:at + n].view_as(g))
            at += n
    for p, g, h in zip(params, grads, held or [None] * len(params)):
        p.grad = g if h is None else g.add_(h)


def recover_from_failed_backward(state: PatchState) -> None:
    """A backward that raised never reached its end: its held gradients go back (with
    whatever it had accumulated, as after any failed backward) and the next one starts anew."""
    held, state.backward = state.backward, None
    for p, h in zip(state.params, held or []):
        if h is not None:
            p.grad = h if p.grad is None else p.grad.add_(h)


def under_fsdp(model: torch.nn.Module, timeout: float) -> bool:
    """Whether FSDP2 (fully_shard) manages some of the model's parameters; if so, every FSDP
    module of it is set to sum its gradients over its mesh, not average them: a rank's gradient
    is its tokens' part of the step's mean loss (whose denominator counts the whole step's
    target tokens, every rank's), so the step's gradient is the plain sum over every rank:
    over sp, dp_shard and dp_replicate alike. Gloo has no PREMUL_SUM, hence the forced sum.
    Checked at every forward: fully_shard may come before or after mmsp.patch. Its all-gathers
    and reduce-scatters are named as mmsp's own collectives are (mmsp.fsdp.named_collectives),
    for a model torch's fully_shard sharded as for mmsp.fully_shard's."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return False
    found = False
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)
            found = True
    if found:
        from mmsp.fsdp import named_collectives

        named_collectives(model, timeout)
    return found


def world_sum(x: torch.Tensor, world, what: str) -> None:
    """x summed over every rank in place: mmsp's all_reduce on the mesh's world group (its
    timeout bounds it; a failure names the group, and here what was being summed)."""
    if world is None:
        return
    try:
        _C.all_reduce_(x, world)
    except ValueError as e:
        raise ValueError(f"mmsp.patch: summing {what} over every rank: {e}") from None
