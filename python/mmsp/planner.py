"""The planner: a packed batch -> this rank's shard, as `mmsp plan` and `mmsp train` plan it.

The batch is what `mmsp plan --batch` reads: {"sequences": [{"input_ids": [...],
"image_grid_thw": [[t, h, w], ...], "labels": [...] (optional), ...}, ...]}. The config is
a model's config.json (a dict, its path, or the model directory): its model_type picks the
family's conventions (token ids, merge, mRoPE).
"""

import json
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Union

import torch

from mmsp._extension import C

if TYPE_CHECKING:
    from mmsp.mesh import Mesh

# A model's config: its config.json as a dict, the file's path or the model directory.
Config = Union[dict, str, "os.PathLike[str]"]


@dataclass
class Shard:
    """This rank's part of a step. L = its slots; padding slots hold token 0, no label."""

    rank: int
    coords: dict[str, int]
    token_ids: torch.Tensor          # int64 [L]
    positions: torch.Tensor          # int64 [3, L] (mRoPE) or [1, L]
    labels: torch.Tensor             # int64 [L], -100 where no loss is taken (already shifted)
    segments: list[torch.Tensor]     # per ring rank of this rank's ring: int64 [T_r] segment of each slot
    orders: list[torch.Tensor]       # ... and its order within the segment (mmsp.ops' layout)
    split_slots: list[int]           # adaptive placement: split slots per context rank; [] for zigzag
    label_count: int                 # labels of the whole batch: the loss normaliser
    sequence: torch.Tensor           # int64 [L]: batch sequence of each slot, -1 for padding
    index_in_sequence: torch.Tensor  # int64 [L]: its index in that sequence, -1 for padding
    packed_index: list[int]          # slot -> index in the packed row, -1 for padding
    encoder_items: list[int]         # vision items this rank encodes (Vision DP)
    encoder_rows: int
    visual_slots: list[int]          # its placeholder slots
    send: list[list[dict[str, int]]]  # [context rank] rows this rank's encoder sends there
    recv: list[list[dict[str, int]]]  # [context rank] rows it receives from there
    plan_json: dict[str, Any] = field(repr=False, default_factory=dict)  # as `mmsp plan --format json --rank`

    def gather(self, per_sequence: list[torch.Tensor]) -> torch.Tensor:
        """Rows of this rank's slots from per-sequence tensors [len_s, ...] (padding: zeros)."""
        first = per_sequence[0]
        out = first.new_zeros((len(self.sequence),) + tuple(first.shape[1:]))
        for slot, (s, i) in enumerate(zip(self.sequence.tolist(), self.index_in_sequence.tolist())):
            if s >= 0:
                out[slot] = per_sequence[s][i]
        return out


def _config_json(config: Config) -> str:
    if isinstance(config, dict):
        return json.dumps(config)
    path = os.fspath(config)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    if not os.path.isfile(path):
        raise ValueError(f"mmsp.plan: config {path!r} is not a config.json file or a model directory")
    with open(path, encoding="utf-8") as f:
        return f.read()


def plan(config: Config, batch: Union[dict[str, Any], str], mesh: Optional["Mesh"] = None, *,
         rank: Optional[int] = None, dp: Optional[int] = None, ring: Optional[int] = None,
         ulysses: Optional[int] = None, layout: str = "zigzag", placement: str = "zigzag") -> Shard:
    """This rank's Shard of `batch` on `mesh` (an mmsp.Mesh), or on dp x ring x ulysses for `rank`."""
    if mesh is not None:
        sizes = dict(mesh.sizes)
        rank = mesh.rank if rank is None else rank
    else:
        sizes = {"dp": dp or 1, "ring": ring or 1, "ulysses": ulysses or 1}
    if rank is None:
        raise ValueError("mmsp.plan: give a mesh, or rank= with dp=, ring=, ulysses=")
    batch_json = json.dumps(batch) if isinstance(batch, dict) else str(batch)
    d = C.plan_step(_config_json(config), batch_json, sizes, rank, layout, placement)
    d["sequence"] = torch.tensor(d["sequence"], dtype=torch.long)
    d["index_in_sequence"] = torch.tensor(d["index_in_sequence"], dtype=torch.long)
    d["plan_json"] = json.loads(d["plan_json"])
    return Shard(**d)
