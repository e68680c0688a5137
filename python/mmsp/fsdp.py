"""FSDP2 on a patched model: mmsp.fully_shard(model, mesh, **fully_shard's options).

It applies torch's fully_shard as torchtitan and VeOmni do: each of transformers' own layer
classes of the model (`model._no_split_modules`: the decoder layers and the vision blocks of
every family, read from transformers, not written here), innermost first, then the root
(embedding, head, mergers and the rest), all over `mesh.fsdp_mesh()`: the folded
dp_shard x sp dimension, with dp_replicate for HSDP. mmsp.patch sets the modules to sum their
gradients at each forward (docs/python-fsdp.md#fsdp2-one-devicemesh-the-training-state-sharded).
"""

from typing import TYPE_CHECKING, Any, TypeVar

import torch

if TYPE_CHECKING:
    from mmsp.mesh import Mesh

Model = TypeVar("Model", bound=torch.nn.Module)


def fully_shard(model: Model, mesh: "Mesh", **options: Any) -> Model:
    """Shards `model` (patched by mmsp.patch, before or after) with FSDP2 over
    mesh.fsdp_mesh(): each module of a class in model._no_split_modules, then the model.
    `options` go to torch.distributed.fsdp.fully_shard (mp_policy, reshard_after_forward,
    offload_policy, ...). Returns the model."""
    from torch.distributed.fsdp import fully_shard as torch_fully_shard

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
    return model
