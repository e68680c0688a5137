"""The mesh of ranks as mmsp lays it out: dp x ring x ulysses on torch.distributed.

Rank r has coordinates ulysses = r % U, ring = (r // U) % R, dp = r // (U * R): the Ulysses
ranks of one ring rank are neighbours, as in `mmsp train` and `mmsp plan`. Every rank must
construct the same Mesh at the same point (it creates torch.distributed subgroups, which is
collective); everything is checked before the first subgroup is made.
"""

from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from mmsp._extension import C


@dataclass(frozen=True)
class Coords:
    dp: int
    ring: int
    ulysses: int


def _positive(name, value):
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"mmsp.Mesh: {name} = {value!r} must be an integer >= 1")


class Mesh:
    """The ring, Ulysses and context (ring x Ulysses: one dp row) groups of this rank
    (None where that group has one rank)."""

    def __init__(self, dp=1, ring=1, ulysses=1, *, timeout=timedelta(minutes=10)):
        for name, value in (("dp", dp), ("ring", ring), ("ulysses", ulysses)):
            _positive(name, value)
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError("mmsp.Mesh: torch.distributed is not initialised; call "
                             "torch.distributed.init_process_group first (torchrun sets its environment)")
        world = dist.get_world_size()
        if dp * ring * ulysses != world:
            raise ValueError(f"mmsp.Mesh: world size {world} is not dp({dp}) x ring({ring}) x ulysses({ulysses}) "
                             f"= {dp * ring * ulysses}; choose factors that multiply to the world size")
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
        if not seconds > 0:
            raise ValueError(f"mmsp.Mesh: timeout {timeout!r} must be positive")
        self.dp, self.ring_size, self.ulysses_size = dp, ring, ulysses
        self.rank = dist.get_rank()
        self.coords = Coords(dp=self.rank // (ulysses * ring), ring=(self.rank // ulysses) % ring,
                             ulysses=self.rank % ulysses)
        self.ring = None
        self.ulysses = None
        self.context = None
        # Every rank creates every subgroup, in one order (torch.distributed.new_group's rule).
        for d in range(dp):
            for u in range(ulysses):
                members = [self.global_rank(d, i, u) for i in range(ring)]
                group = self._new_group(members, f"ring[dp={d},u={u}]", seconds) if ring > 1 else None
                if (d, u) == (self.coords.dp, self.coords.ulysses):
                    self.ring = group
            for i in range(ring):
                members = [self.global_rank(d, i, u) for u in range(ulysses)]
                group = self._new_group(members, f"ulysses[dp={d},r={i}]", seconds) if ulysses > 1 else None
                if (d, i) == (self.coords.dp, self.coords.ring):
                    self.ulysses = group
            members = [self.global_rank(d, i, u) for i in range(ring) for u in range(ulysses)]
            group = self._new_group(members, f"context[dp={d}]", seconds) if ring * ulysses > 1 else None
            if d == self.coords.dp:
                self.context = group

    def global_rank(self, dp, ring, ulysses):
        return (dp * self.ring_size + ring) * self.ulysses_size + ulysses

    @staticmethod
    def _new_group(members, name, seconds):
        pg = dist.new_group(members, timeout=timedelta(seconds=seconds))
        if pg is None or pg == dist.GroupMember.NON_GROUP_MEMBER:
            return None  # not a member: this rank never uses it
        return C.Group(pg, members, name, seconds)

    def __repr__(self):
        return (f"mmsp.Mesh(dp={self.dp}, ring={self.ring_size}, ulysses={self.ulysses_size}; "
                f"rank {self.rank} at {self.coords})")
