"""The planner: a packed batch -> this rank's shard, as `mmsp plan` and `mmsp train` plan it.

The batch is what `mmsp plan --batch` reads: {"sequences": [{"input_ids": [...],
"image_grid_thw": [[t, h, w], ...], "labels": [...] (optional), ...}, ...]}. The config is
a model's config.json (a dict, its path, or the model directory): its model_type picks the
family's conventions (token ids, merge, mRoPE).
"""

import json
import os
from dataclasses import dataclass, field

import torch

from mmsp._extension import C


@dataclass
class Shard:
    """This rank's part of a step. L = its slots; padding slots hold token 0, no label."""

    rank: int
    coords: dict
    token_ids: torch.Tensor          # int64 [L]
    positions: torch.Tensor          # int64 [3, L] (mRoPE) or [1, L]
    labels: torch.Tensor             # int64 [L], -100 where no loss is taken (already shifted)
    segments: list                   # per ring rank of this rank's ring: int64 [T_r] segment of each slot
    orders: list                     # ... and its order within the segment (mmsp.ops' layout)
    split_slots: list                # adaptive placement: split slots per context rank; [] for zigzag
    label_count: int                 # labels of the whole batch: the loss normaliser
    sequence: torch.Tensor           # int64 [L]: batch sequence of each slot, -1 for padding
    index_in_sequence: torch.Tensor  # int64 [L]: its index in that sequence, -1 for padding
    packed_index: list               # slot -> index in the packed row, -1 for padding
    encoder_items: list              # vision items this rank encodes (Vision DP)
    encoder_rows: int
    visual_slots: list               # its placeholder slots
    send: list                       # [context rank] rows this rank's encoder sends there
    recv: list                       # [context rank] rows it receives from there
    plan_json: dict = field(repr=False, default_factory=dict)  # as `mmsp plan --format json --rank`

    def gather(self, per_sequence):
        """Rows of this rank's slots from per-sequence tensors [len_s, ...] (padding: zeros)."""
        first = per_sequence[0]
        out = first.new_zeros((len(self.sequence),) + tuple(first.shape[1:]))
        for slot, (s, i) in enumerate(zip(self.sequence.tolist(), self.index_in_sequence.tolist())):
            if s >= 0:
                out[slot] = per_sequence[s][i]
        return out


def _config_json(config):
    if isinstance(config, dict):
        return json.dumps(config)
    path = os.fspath(config)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    if not os.path.isfile(path):
        raise ValueError(f"mmsp.plan: config {path!r} is not a config.json file or a model directory")
    with open(path, encoding="utf-8") as f:
        return f.read()


def plan(config, batch, mesh=None, *, rank=None, dp=None, ring=None, ulysses=None, layout="zigzag",
         placement="zigzag"):
    """This rank's Shard of `batch` on `mesh` (an mmsp.Mesh), or on dp x ring x ulysses for `rank`."""
    if mesh is not None:
        dp, ring, ulysses = mesh.dp, mesh.ring_size, mesh.ulysses_size
        rank = mesh.rank if rank is None else rank
    dp, ring, ulysses = dp or 1, ring or 1, ulysses or 1
    if rank is None:
        raise ValueError("mmsp.plan: give a mesh, or rank= with dp=, ring=, ulysses=")
    batch_json = json.dumps(batch) if isinstance(batch, dict) else str(batch)
    d = C.plan_step(_config_json(config), batch_json, dp, ring, ulysses, rank, layout, placement)
    d["sequence"] = torch.tensor(d["sequence"], dtype=torch.long)
    d["index_in_sequence"] = torch.tensor(d["index_in_sequence"], dtype=torch.long)
    d["plan_json"] = json.loads(d["plan_json"])
    return Shard(**d)
