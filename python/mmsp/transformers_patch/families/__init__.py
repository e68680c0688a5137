"""What mmsp.patch knows of a model's family: one module per family kind, each saying how
its batch's placeholders become the planner's vision items, how its tower encodes them and
what its decoder takes besides the embeddings. The family itself (its token ids, merge,
whether video frames are blocks) comes from mmsp's C++ registry (mmsp._C.model_conventions),
the one table `mmsp train` and the planner read too."""

import json
from dataclasses import dataclass
from typing import Any

from mmsp._extension import C as _C
from mmsp.transformers_patch.families.internvl import InternVL
from mmsp.transformers_patch.families.kind import Kind
from mmsp.transformers_patch.families.llava import Llava
from mmsp.transformers_patch.families.qwen import Qwen

# Every kind by name; `kind` in Family is one of these.
KINDS: dict[str, Kind] = {k.name: k for k in (Qwen(deepstack=False), Qwen(deepstack=True), Llava(), InternVL())}


@dataclass(frozen=True)
class Family:
    """What the patch needs of a model's family. `kind` is how its pixels and placeholders
    are laid out: "qwen" (mRoPE, grids), "qwen3" (and deepstack rows), "llava", "internvl"."""
    kind: str
    frames_as_blocks: bool  # each temporal patch of a video its own vision block (Qwen3-VL, Qwen3.5)
    image_token: int
    video_token: int        # -1: the family takes no videos
    merge: int              # patches merged into one placeholder row (Qwen: spatial_merge_size²)

    @property
    def rules(self) -> Kind:
        return KINDS[self.kind]


def family_of(config: Any) -> Family:
    """The model's family from the model layer's registry, plus what transformers' own config
    says of deepstack. An unsupported model_type is a ValueError listing the supported."""
    try:
        conv = _C.model_conventions(json.dumps(config.to_dict()))
    except ValueError as e:
        raise ValueError(f"mmsp.patch: {e}") from None
    kind = next((k.name for k in KINDS.values() if k.serves(conv, config)), None)
    if kind is None:
        raise ValueError(f"mmsp.patch: model_type {config.model_type!r} ({conv['name']} conventions) is supported by "
                         "mmsp's model layer but not by mmsp.patch yet")
    return Family(kind, bool(conv["frames_as_blocks"]), int(conv["image_token_id"]), int(conv["video_token_id"]),
                  int(conv["spatial_merge_size"]) ** 2 if conv["mrope"] else 1)
