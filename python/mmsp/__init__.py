"""mmsp from Python: exact sequence parallelism for vision-language models on torch.distributed.

    import torch.distributed as dist, mmsp
    dist.init_process_group("gloo")                        # or "nccl"; launched by torchrun
    mesh = mmsp.Mesh(ring=2, ulysses=2)                    # the context group of every rank
    shard = mmsp.plan("config.json", batch, mesh)          # this rank's tokens, positions, labels, layout
    out = mmsp.ops.attention(q, k, v, shard, mesh)         # equal to one process, forward and backward

`mmsp.patch(model, mesh)` makes a transformers VLM train on the mesh with the loop unchanged
(`mmsp.fully_shard(model, mesh)` shards it with FSDP2 on the same mesh);
`mmsp.ops` holds the sequence-parallel ops (attention: local, Ulysses, zigzag ring, hybrid;
Gated DeltaNet's conv and rule with ring state passing; Ulysses' head exchange), `mmsp.plan`
the planner, `mmsp.Mesh` the process groups, `mmsp.rl` the RL and preference losses on the
patched model's per-token log-probs. `mmsp.prepare` turns conversation data into
mmsp's training format. The ops and the planner are mmsp's C++ (mmsp._C, built by
`make python`); `mmsp.prepare` needs no build. docs/python.md has the API and its rules.
"""

from importlib import import_module as _import_module
from typing import TYPE_CHECKING, Any

from mmsp._version import __version__

__all__ = ["Mesh", "Shard", "plan", "ops", "patch", "fully_shard", "rl", "__version__"]

if TYPE_CHECKING:  # what the lazy names below are, for type checkers
    from mmsp import ops, rl
    from mmsp.fsdp import fully_shard
    from mmsp.mesh import Mesh
    from mmsp.planner import Shard, plan
    from mmsp.transformers_patch import patch


def __getattr__(name: str) -> Any:
    # The C++ parts load on first use, so `python -m mmsp.prepare` runs without the extension.
    if name == "Mesh":
        return _import_module("mmsp.mesh").Mesh
    if name in ("Shard", "plan"):
        return getattr(_import_module("mmsp.planner"), name)
    if name == "ops":
        return _import_module("mmsp.ops")
    if name == "patch":
        return _import_module("mmsp.transformers_patch").patch
    if name == "rl":
        return _import_module("mmsp.rl")
    if name == "fully_shard":
        return _import_module("mmsp.fsdp").fully_shard
    raise AttributeError(f"module 'mmsp' has no attribute {name!r}")
