"""What mmsp.patch keeps on a patched model (`model._mmsp`), and the step being computed.

The state lives from patch() on; `step` is set by the patched forward for the layers it
calls (the attention and Gated DeltaNet replacements read this rank's shard and the mesh
from it) and names the one step whose layout those layers run on.
"""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

import torch

if TYPE_CHECKING:
    from mmsp.mesh import Mesh
    from mmsp.planner import Shard
    from mmsp.transformers_patch.families import Family


@dataclass
class PatchState:
    family: "Family"
    mesh: "Mesh"
    config: dict[str, Any]  # the model's config as a dict: what the planner reads
    layout: str
    placement: str
    batch: str  # "shared" or "per_rank"
    # from a forward to its backward's end: the weights whose gradients mmsp sums
    params: list[torch.Tensor] = field(default_factory=list)
    # while a backward runs: the gradients held from before it (accumulation)
    backward: Optional[list[Optional[torch.Tensor]]] = None
    pending: bool = False  # a forward with a graph whose backward has not begun
    # the step's sequences and this rank's rows of them (token_values.StepLayout), set by each forward
    step_layout: Any = None
    temperature: float = 1.0  # of the per-token values when the call gives none (TRL's fused head's)
    experts: bool = False  # a mixture-of-experts model (experts.py): its routers are recorded


@dataclass
class Routers:
    """A mixture-of-experts step's router logits, layer by layer, while its forward runs (the
    auxiliary loss reads them; closed then, so that a recomputation adds none)."""
    logits: list[torch.Tensor] = field(default_factory=list)
    open: bool = True


@dataclass(frozen=True)
class Step:
    """The step the decoder's replaced layers run on: this rank's shard of it, on `mesh`."""
    shard: "Shard"
    mesh: "Mesh"
    routers: Optional[Routers] = None  # mixture-of-experts models with the auxiliary loss


_current: dict[str, Step] = {}


def set_step(step: Step) -> None:
    _current["step"] = step


def running_step() -> Optional[Step]:
    """The step of the patched forward last run (None before any)."""
    return _current.get("step")


def current_step(what: str) -> Step:
    """The step of the patched forward running now; a ValueError naming `what` outside one."""
    step = _current.get("step")
    if step is None:
        raise ValueError(f"mmsp.patch: {what} ran outside the patched forward")
    return step
