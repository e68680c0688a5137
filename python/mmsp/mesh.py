"""The mesh of ranks as mmsp lays it out on torch.distributed, its axes read from mmsp's one
table of them (mmsp._C.mesh_axes(): the C++ plan::mesh_axes()).

The dimensions dp x ring x ulysses multiply to the world: rank r has coordinates
ulysses = r % U, ring = (r // U) % R, dp = r // (U * R), so the Ulysses ranks of one ring rank
are neighbours, as in `mmsp train` and `mmsp plan`; the flattened axes (context = ring x
ulysses, world) and the folded ones (expert: blocks of `expert` consecutive ranks, adding none)
come with them. Every rank must construct the same Mesh at the same point (it creates
torch.distributed subgroups, which is collective). The ranks first agree on the mesh through
the default group's store (each posts its axes' sizes and timeout, and waits at most the
timeout for the others'): a rank that asked for another mesh, or an impossible one, is a
ValueError on every rank naming it, before the first subgroup is made; a rank that never comes
is named after the timeout.
"""

import json
import math
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Iterable, Optional, Union

import torch
import torch.distributed as dist

from mmsp import library
from mmsp._extension import C

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

_meshes = 0  # Mesh constructions in this process: every rank counts alike, and keys its posts by it


@dataclass(frozen=True)
class Coords:
    """A rank's coordinate on each dimension of the mesh."""
    dp: int
    ring: int
    ulysses: int


def _positive(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"mmsp.Mesh: {name} = {value!r} must be an integer >= 1")


def _seconds(timeout: object) -> Optional[float]:
    try:
        return timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


class Mesh:
    """The ring, Ulysses and context (ring x Ulysses: one dp row) groups of this rank
    (None where that group has one rank), and `world`: every rank, with this mesh's timeout
    (mmsp.patch sums the loss and the gradients over it)."""

    # mesh.ring, .ulysses, .context, .world: this rank's group of that axis (None: one rank);
    # mesh.groups holds every axis's, by name.

    def __init__(self, dp: int = 1, ring: int = 1, ulysses: int = 1, *,
                 timeout: Union[timedelta, float] = timedelta(minutes=10), **axes: int) -> None:
        """`axes`: the sizes of the table's other axes (expert=E); an axis not given is 1."""
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError("mmsp.Mesh: torch.distributed is not initialised; call "
                             "torch.distributed.init_process_group first (torchrun sets its environment)")
        table = C.mesh_axes()
        sized = [a["name"] for a in table if a["has_size"]]
        dimensions = [a["name"] for a in table if a["kind"] == "dimension"]
        sizes = {name: 1 for name in sized}
        sizes.update(dp=dp, ring=ring, ulysses=ulysses)
        unknown = sorted(set(axes) - set(sized))
        if unknown:
            raise ValueError(f"mmsp.Mesh: {', '.join(unknown)} is not a mesh axis with a size (the axes: "
                             f"{', '.join(sized)})")
        sizes.update(axes)
        seconds = _seconds(timeout)
        _agree(dict(sizes, timeout=seconds if seconds is not None else repr(timeout)),
               seconds if seconds is not None and seconds > 0 else 600.0)
        for name, value in sizes.items():
            _positive(name, value)
        world = dist.get_world_size()
        product = math.prod(sizes[d] for d in dimensions)
        if product != world:
            shape = " x ".join(f"{d}({sizes[d]})" for d in dimensions)
            raise ValueError(f"mmsp.Mesh: world size {world} is not {shape} = {product}; choose factors that "
                             "multiply to the world size")
        if seconds is None or not 0 < seconds < float("inf"):
            raise ValueError(f"mmsp.Mesh: timeout {timeout!r} must be a positive number of seconds or a timedelta")
        try:
            C.mesh_group_members(sizes, "world", 0)  # the table's own checks (an expert degree that divides)
        except ValueError as e:
            raise ValueError(f"mmsp.Mesh: {e}") from None
        self.dp, self.ring_size, self.ulysses_size = dp, ring, ulysses
        self.sizes: dict[str, int] = sizes  # by mesh axis name
        self.timeout: float = seconds
        self.rank = dist.get_rank()
        self.coords = Coords(**C.mesh_rank_coords(sizes, self.rank))
        self.device_mesh: Optional["DeviceMesh"] = None  # the torch DeviceMesh it came from, if any
        self._fsdp: Optional["DeviceMesh"] = None
        self.world_group: Optional[dist.ProcessGroup] = None  # the torch group (for torch.distributed calls)
        # This rank's group of every axis (None where it has one rank), every rank making every
        # group in the table's order (torch.distributed.new_group's rule).
        self.groups: dict[str, Optional[C.Group]] = _make_groups(sizes, world, self.rank, seconds, self)
        # The names torch.ops.mmsp's ops take for these groups (a compiled graph holds strings, not groups).
        self.op_groups: dict[str, str] = {axis: library.group_key(group) for axis, group in self.groups.items()}

    @property
    def world(self) -> Optional[C.Group]:
        """Every rank, with this mesh's timeout (mmsp.patch sums the loss and the gradients over it)."""
        return self.groups["world"]

    @property
    def ring(self) -> Optional[C.Group]:
        return self.groups["ring"]

    @property
    def ulysses(self) -> Optional[C.Group]:
        return self.groups["ulysses"]

    @property
    def context(self) -> Optional[C.Group]:
        return self.groups["context"]

    @classmethod
    def from_device_mesh(cls, device_mesh: "DeviceMesh", *, ring: Optional[str] = "ring",
                         ulysses: Optional[str] = "ulysses", expert: int = 1,
                         timeout: Union[timedelta, float] = timedelta(minutes=10)) -> "Mesh":
        """The Mesh of a torch DeviceMesh that spans every rank: its dimension named `ring` is
        the ring, `ulysses` Ulysses (either may be absent: size 1), every other dimension
        (dp_replicate, dp_shard, ...) folds into dp. One mesh for FSDP2, mmsp and the user's
        code: `init_device_mesh("cuda", (dp_shard, ring, ulysses), mesh_dim_names=("dp_shard",
        "ring", "ulysses"))`. The layout must be mmsp's (ulysses fastest, then ring, then the
        dp dimensions), which init_device_mesh gives when the SP dimensions come last. `expert`:
        the expert-parallel degree, folded into those ranks (blocks of `expert` consecutive ranks
        split every mixture-of-experts layer's experts; it adds no dimension)."""
        names = tuple(device_mesh.mesh_dim_names or ())
        if not names:
            raise ValueError("mmsp.Mesh.from_device_mesh: the DeviceMesh has no mesh_dim_names; name its "
                             "dimensions (init_device_mesh(..., mesh_dim_names=...)) so mmsp can find ring and ulysses")
        for role, name, default in (("ring", ring, "ring"), ("ulysses", ulysses, "ulysses")):
            if name is not None and name != default and name not in names:
                raise ValueError(f"mmsp.Mesh.from_device_mesh: {role}={name!r} is not a dimension of the DeviceMesh "
                                 f"(its dimensions: {', '.join(names)})")
        sp = [n for n in (ring, ulysses) if n is not None and n in names]
        if len(set(sp)) != len(sp):
            raise ValueError(f"mmsp.Mesh.from_device_mesh: ring and ulysses are both {sp[0]!r}; name two dimensions")
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else None
        if device_mesh.size() != world:
            raise ValueError(f"mmsp.Mesh.from_device_mesh: the DeviceMesh holds {device_mesh.size()} ranks but the "
                             f"world has {world}; mmsp's mesh spans every rank")
        size = dict(zip(names, device_mesh.mesh.shape))
        others = [n for n in names if n not in sp]
        order = [names.index(n) for n in others + sp]
        laid = device_mesh.mesh.permute(order).reshape(-1).tolist()
        if laid != list(range(world)):
            raise ValueError(f"mmsp.Mesh.from_device_mesh: ranks laid out as {device_mesh.mesh.tolist()} over "
                             f"({', '.join(names)}) are not mmsp's layout: rank = (dp x ring + ring_index) x ulysses "
                             "+ ulysses_index, the dp dimensions first; put the ring and ulysses dimensions last, "
                             "ulysses innermost (as init_device_mesh lays out (..., ring, ulysses))")
        R = size[ring] if ring in sp else 1
        U = size[ulysses] if ulysses in sp else 1
        mesh = cls(dp=world // (R * U), ring=R, ulysses=U, timeout=timeout, expert=expert)
        mesh.device_mesh = device_mesh
        return mesh

    def fsdp_mesh(self, replicate: Optional[str] = "dp_replicate") -> "DeviceMesh":
        """The DeviceMesh to give FSDP2's fully_shard: every dimension folded into one,
        "dp_shard_sp" (dp_shard x ring x ulysses), so the parameters are sharded over every rank
        whose tokens make gradients for them; with a dimension named `replicate` in the
        DeviceMesh, 2-D (replicate, dp_shard_sp): HSDP. mmsp.patch makes FSDP2 sum, not average,
        over it (each rank's gradient is its tokens' part of the step's mean). Its groups are made
        here with the Mesh's timeout, so a stopped or dead peer ends FSDP2's collectives within it."""
        if self._fsdp is not None:
            return self._fsdp
        from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

        dm = self.device_mesh
        names: tuple[str, ...] = tuple(dm.mesh_dim_names or ()) if dm is not None else ()
        hsdp = replicate is not None and replicate in names
        if hsdp and names.index(replicate) != 0:
            raise ValueError(f"mmsp.Mesh.fsdp_mesh: {replicate!r} must be the DeviceMesh's first dimension "
                             f"for HSDP (its dimensions: {', '.join(names)})")
        device = dm.device_type if dm is not None else "cuda" if dist.get_backend() == "nccl" else "cpu"
        world = dist.get_world_size()
        if self.world_group is None:  # one rank: nothing to time out
            self._fsdp = init_device_mesh(device, (world,), mesh_dim_names=("dp_shard_sp",))
            return self._fsdp
        # FSDP2's collectives run on these groups: made here with the mesh's timeout (the
        # DeviceMesh's own, init_device_mesh's, have the default group's: 30 min for Gloo).
        if not hsdp:
            self._fsdp = DeviceMesh.from_group(self.world_group, device, mesh_dim_names=("dp_shard_sp",))
            return self._fsdp
        assert dm is not None and replicate is not None, "HSDP comes from a DeviceMesh with a replicate dimension"
        ranks = torch.arange(world).reshape(dm.mesh.shape[0], -1)  # mmsp's layout: replicate outermost
        shard = _member_group([row.tolist() for row in ranks], self.timeout)
        replicas = _member_group([column.tolist() for column in ranks.T], self.timeout)
        self._fsdp = DeviceMesh.from_group([replicas, shard], device, mesh=ranks,
                                           mesh_dim_names=(replicate, "dp_shard_sp"))
        return self._fsdp

    def global_rank(self, dp: int, ring: int, ulysses: int) -> int:
        """The rank at these coordinates."""
        return (dp * self.ring_size + ring) * self.ulysses_size + ulysses

    def __repr__(self) -> str:
        others = "".join(f", {name}={size}" for name, size in self.sizes.items()
                         if name not in ("dp", "ring", "ulysses") and size != 1)
        return (f"mmsp.Mesh(dp={self.dp}, ring={self.ring_size}, ulysses={self.ulysses_size}{others}; "
                f"rank {self.rank} at {self.coords})")


def _make_groups(sizes: dict[str, int], world: int, rank: int, seconds: float,
                 mesh: Mesh) -> dict[str, Optional[C.Group]]:
    """Every axis's groups, made by every rank in the table's order; this rank's of each."""
    mine: dict[str, Optional[C.Group]] = {}
    for axis in C.mesh_axes():
        name = axis["name"]
        groups = []  # every group of the axis, by first member, each once
        for r in range(world):
            members = C.mesh_group_members(sizes, name, r)
            if members not in groups:
                groups.append(members)
        if axis["kind"] == "folded" and groups == [list(range(world))] and name != "world":
            mine[name] = mine["world"]  # expert 1: the ranks holding the same experts are the world
            continue
        mine[name] = None
        for members in groups:
            if len(members) == 1:
                continue  # a one-rank group: no process group (its collectives move nothing)
            pg = dist.new_group(members, timeout=timedelta(seconds=seconds))
            if rank in members:
                assert isinstance(pg, dist.ProcessGroup), "a member gets its group"
                mine[name] = C.Group(pg, members, C.mesh_group_name(sizes, name, rank), seconds)
                if name == "world":
                    mesh.world_group = pg
    return mine


def _member_group(partition: list[list[int]], seconds: float) -> dist.ProcessGroup:
    """This rank's group of a partition of the world, with the timeout; every rank makes every group."""
    mine = None
    for members in partition:
        pg = dist.new_group(members, timeout=timedelta(seconds=seconds))
        if dist.get_rank() in members:
            mine = pg
    assert isinstance(mine, dist.ProcessGroup), "every rank is in one group of the partition"
    return mine


def _agree(mine: dict[str, Any], seconds: float) -> None:
    """Every rank's `mine` (the Mesh's arguments) through the default store, waiting at most
    `seconds`; a ValueError on every rank naming the ranks that differ, or that never came."""
    global _meshes
    _meshes += 1
    store = dist.distributed_c10d._get_default_store()
    rank, world = dist.get_rank(), dist.get_world_size()
    keys = [f"mmsp/mesh/{_meshes}/{r}" for r in range(world)]
    store.set(keys[rank], json.dumps(mine, default=repr))
    try:
        store.wait(keys, timedelta(seconds=seconds))
    except Exception:  # the store's timeout: name who never posted
        missing = _missing(store, keys)
        _release(store, rank, [r for r in range(world) if r not in missing], seconds)
        raise ValueError(f"mmsp.Mesh: {_ranks(missing) if missing else 'a rank'} did not construct mmsp.Mesh within "
                         f"{seconds:g} s (rank {rank} did, as its construction number {_meshes} in this process): "
                         "every rank must construct the same Meshes in the same order (stopped, hung or took "
                         "another path?)") from None
    try:
        every = [json.loads(v) for v in store.multi_get(keys)]
    except Exception as e:  # rank 0, which hosts the store without torchrun, ended before this rank read it
        raise ValueError(f"mmsp.Mesh: the default group's store stopped answering while the ranks compared their "
                         f"meshes (did rank 0 end?): {type(e).__name__}: {e}") from None
    differ = []
    for name in mine:
        values: dict[str, list[int]] = {}
        for r, theirs in enumerate(every):
            values.setdefault(json.dumps(theirs.get(name)), []).append(r)
        if len(values) > 1:
            differ.append(f"{name} is " + " but ".join(f"{v} on {_ranks(rs)}" for v, rs in values.items()))
    if differ:
        _release(store, rank, list(range(world)), seconds)
        raise ValueError(f"mmsp.Mesh: the ranks asked for different meshes: {'; '.join(differ)}. Every rank must "
                         "construct the same Mesh (it creates process groups together); stopped before the first")


def _missing(store: Any, keys: list[str]) -> list[int]:
    try:
        return [r for r, k in enumerate(keys) if not store.check([k])]
    except Exception:  # the store itself is gone: no one to name
        return []


def _release(store: Any, rank: int, readers: list[int], seconds: float) -> None:
    """Before a ValueError ends the program: each rank says it has read the store, and rank 0
    (which hosts the store unless torchrun's agent does) waits for the `readers` to say so (at
    most the timeout, 10 s at most), so that its exit does not take the store from a rank still
    reading it (whose error would be the store's DistNetworkError instead of this one)."""
    read = [f"mmsp/mesh/{_meshes}/read/{r}" for r in readers]
    try:
        store.set(f"mmsp/mesh/{_meshes}/read/{rank}", "1")
        if rank == 0:
            store.wait(read, timedelta(seconds=min(seconds, 10.0)))
    except Exception:  # a reader that never reads (stopped, dead): the error goes out all the same
        pass


def _ranks(ranks: Iterable[int]) -> str:
    listed = list(ranks)
    if len(listed) == 1:
        return f"rank {listed[0]}"
    return "ranks " + ", ".join(map(str, listed[:-1])) + f" and {listed[-1]}"
