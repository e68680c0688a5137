"""mmsp.patch under transformers.Trainer (through accelerate): the patch sums the gradients
itself, so accelerate must not wrap the model in DDP (whose average would come on top), but
may shard it with FSDP2 (its plugin), whose reduction the patch then sets to a sum."""

from typing import Any

import torch


def accelerate_shards_with_fsdp() -> bool:
    """Whether accelerate's state (made by transformers.Trainer) is set up for FSDP."""
    try:
        from accelerate.state import AcceleratorState
        from accelerate.utils import DistributedType
    except ImportError:
        return False
    shared = AcceleratorState._shared_state
    if not shared or shared.get("distributed_type") != DistributedType.FSDP:
        return False
    version = getattr(shared.get("fsdp_plugin"), "fsdp_version", None)
    if version != 2:
        raise ValueError(f"mmsp.patch: accelerate is set up for FSDP version {version}; the patch composes with FSDP2 "
                         "only (fully_shard, whose gradient reduction it sets to a sum): pass "
                         "fsdp_config={'version': 2} to TrainingArguments")
    return True


def mark_prepared_unless_fsdp(model: torch.nn.Module) -> None:
    """model._is_accelerate_prepared reads True (accelerate leaves the model as it is: no DDP)
    unless accelerate is set up for FSDP, which then prepares it (fully_shard); accelerate's
    own assignment after that is kept. A property needs the class: the model's class becomes a
    subclass of the same name (as fully_shard does), so save_pretrained writes the same
    architecture."""
    cls = type(model)
    if not getattr(cls, "_mmsp_patched_class", False):
        def get(self: Any) -> bool:
            return self.__dict__.get("_mmsp_prepared", False) or not accelerate_shards_with_fsdp()

        def set_(self: Any, value: bool) -> None:
            self.__dict__["_mmsp_prepared"] = value

        model.__class__ = type(cls.__name__, (cls,), {"_is_accelerate_prepared": property(get, set_),
                                                      "_mmsp_patched_class": True, "__module__": cls.__module__,
                                                      "__qualname__": cls.__qualname__})
