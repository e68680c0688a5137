"""FSDP2 on a patched model: mmsp.fully_shard(model, mesh, **fully_shard's options).

It applies torch's fully_shard as torchtitan and VeOmni do: each of transformers' own layer
classes of the model (`model._no_split_modules`: the decoder layers and the vision blocks of
every family, read from transformers, not written here), innermost first, then the root
(embedding, head, mergers and the rest), all over `mesh.fsdp_mesh()`: the folded
dp_shard x sp dimension, with dp_replicate for HSDP. mmsp.patch sets the modules to sum their
gradients at each forward (docs/python-fsdp.md#fsdp2-one-devicemesh-the-training-state-sharded).

FSDP2's all-gathers and reduce-scatters run on the groups of mesh.fsdp_mesh(), which carry the
mesh's timeout, through FSDP2's custom-comm hooks (set_custom_all_gather /
set_custom_reduce_scatter): the same collectives, whose failure (a peer stopped, killed or
calling something else) is a ValueError naming the collective, the group and the timeout, as
mmsp's own collectives word it, not Gloo's bare message.
"""

from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, TypeVar

import torch
import torch.distributed as dist

try:  # the interfaces set_custom_all_gather / set_custom_reduce_scatter take (not re-exported by torch)
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
except ImportError:  # pragma: no cover - another torch: the hooks are then not set (named_collectives)
    AllGather = ReduceScatter = object  # type: ignore[misc,assignment]

if TYPE_CHECKING:
    from mmsp.mesh import Mesh

Model = TypeVar("Model", bound=torch.nn.Module)


def fully_shard(model: Model, mesh: "Mesh", **options: Any) -> Model:
    """Shards `model` (patched by mmsp.patch, before or after) with FSDP2 over
    mesh.fsdp_mesh(): each module of a class in model._no_split_modules, then the model.
    `options` go to torch.distributed.fsdp.fully_shard (mp_policy, reshard_after_forward,
    offload_policy, ...). Returns the model."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp import fully_shard as torch_fully_shard

    sharded = next((name or type(model).__name__ for name, m in model.named_modules() if isinstance(m, FSDPModule)),
                   None)
    if sharded is not None:
        raise ValueError(f"mmsp.fully_shard: the model is already sharded by FSDP2 ({sharded}); shard it once")
    if "mesh" in options:
        raise ValueError("mmsp.fully_shard: the mesh is mesh.fsdp_mesh() of the mmsp.Mesh given; do not pass mesh=")
    units = set(getattr(model, "_no_split_modules", None) or ())
    if not units:
        raise ValueError(f"mmsp.fully_shard: {type(model).__name__} names no layer classes (_no_split_modules is "
                         "empty); apply torch's fully_shard to its layers yourself")
    layers = [m for m in model.modules() if m is not model and type(m).__name__ in units]
    device_mesh = mesh.fsdp_mesh()
    for layer in reversed(layers):  # innermost first: FSDP2 shards a parent after its children
        torch_fully_shard(layer, mesh=device_mesh, **options)
    torch_fully_shard(model, mesh=device_mesh, **options)
    named_collectives(model, mesh.timeout)
    return model


def named_collectives(model: torch.nn.Module, timeout: float) -> None:
    """Sets each FSDP module's all-gather and reduce-scatter to mmsp's named ones (once; a
    custom comm of the user's is kept). A module with several parameter groups is left as is."""
    from torch.distributed.fsdp import FSDPModule

    if AllGather is object:
        return
    for m in model.modules():
        if not isinstance(m, FSDPModule):
            continue
        groups = getattr(m._get_fsdp_state(), "_fsdp_param_groups", [])
        default = [type(getattr(g, attr, None)).__name__ for g in groups
                   for attr in ("_all_gather_comm", "_reduce_scatter_comm")]
        if len(groups) != 1 or default != ["DefaultAllGather", "DefaultReduceScatter"]:
            continue
        m.set_custom_all_gather(_NamedAllGather(timeout))
        m.set_custom_reduce_scatter(_NamedReduceScatter(timeout))


def _message(what: str, group: dist.ProcessGroup, timeout: float, error: BaseException) -> str:
    return (f"mmsp.fully_shard: FSDP2's {what} on group dp_shard_sp ({group.size()} ranks) failed: a peer rank died, "
            f"hung or disagreed on the call (timeout {timeout:g} s). Backend said: {error}")


class _NamedWork(dist.Work):
    """An asynchronous collective's Work whose wait() fails with mmsp's message."""

    def __init__(self, work: dist.Work, message: Callable[[BaseException], str]) -> None:
        super().__init__()
        self._work, self._message = work, message

    def wait(self, timeout: Optional[Any] = None) -> bool:
        try:
            return self._work.wait() if timeout is None else self._work.wait(timeout)
        except RuntimeError as e:  # Gloo's and c10d's errors (DistError is one)
            raise ValueError(self._message(e)) from None


def _named(what: str, group: dist.ProcessGroup, timeout: float, call: Callable[[], Optional[dist.Work]]) \
        -> Optional[dist.Work]:
    def message(error: BaseException) -> str:
        return _message(what, group, timeout, error)

    try:
        work = call()
    except RuntimeError as e:
        raise ValueError(message(e)) from None
    return _NamedWork(work, message) if work is not None else None


class _Allocating:
    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)


class _NamedAllGather(_Allocating, AllGather):  # type: ignore[misc]
    def __init__(self, timeout: float) -> None:
        self.timeout = timeout

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 async_op: bool = False) -> Optional[dist.Work]:
        return _named("all_gather", group, self.timeout, lambda: dist.all_gather_single(
            output_tensor, input_tensor, group=group, async_op=async_op))


class _NamedReduceScatter(_Allocating, ReduceScatter):  # type: ignore[misc]
    def __init__(self, timeout: float) -> None:
        self.timeout = timeout

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 op: Any, async_op: bool = False) -> Optional[dist.Work]:
        return _named("reduce_scatter", group, self.timeout, lambda: dist.reduce_scatter_single(
            output=output_tensor, input=input_tensor, group=group, op=op, async_op=async_op))
