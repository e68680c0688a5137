"""A step made of every rank's own batch (mmsp.patch(..., batch="per_rank")).

Data loaders built for data parallelism (transformers.Trainer's, accelerate's, a
DistributedSampler) give each rank a different micro-batch. Sequence parallelism wants one
batch split over the ranks. Here the step's batch is the union of all ranks' batches, rank 0's
sequences first: the same samples, in the same order, that one process with a batch of
world × per-rank samples sees. What every rank needs to plan it — token ids, labels, image
grids — travels to every rank (one all_gather_object of lists of ints); pixels travel only
from the rank that loaded an image to the rank that encodes it (one all-to-all), so each
image's pixels cross the network at most once.

A rank's bad batch is an error on every rank: the checks run before the gather, and their
message is what the gather carries. Both exchanges run on the mesh's world group, with the
mesh's timeout; a failure (a stopped or dead peer) names the exchange and the group.
"""
import torch
import torch.distributed as dist

from mmsp.transformers_patch.families import KINDS


def _on_world(mesh, what, call):
    """call() (a torch.distributed collective on mesh.world_group), its failure in mmsp's words."""
    try:
        return call()
    except (RuntimeError, dist.DistError) as e:
        raise ValueError(f"{what} on group world ({dist.get_world_size()} ranks) failed: a peer rank died, hung or "
                         f"disagreed on the call (timeout {mesh.timeout:g} s). Backend said: {e}") from None


def image_sizes(kind, grids):
    """Rows of pixel_values per image: patches (Qwen), tiles (InternVL), one image (LLaVA)."""
    return KINDS[kind].pixel_rows(grids)


class LocalPixels:
    """A shared batch's pixel_values (or pixel_values_videos): every item's rows are here."""

    def __init__(self, kind, grids, pixel_values, name="pixel_values", items="images"):
        self.sizes = image_sizes(kind, grids)
        rows = 0 if pixel_values is None else pixel_values.shape[0]
        if sum(self.sizes) != rows:
            raise ValueError(f"mmsp.patch: {name} has {rows} rows but the batch's {items} need {sum(self.sizes)}")
        self.offsets = [sum(self.sizes[:g]) for g in range(len(self.sizes))]
        self.pixel_values = pixel_values

    def rows(self, images):
        if not images:
            return None
        return torch.cat([self.pixel_values[self.offsets[g]:self.offsets[g] + self.sizes[g]] for g in images])


class RoutedPixels:
    """The union's images, each on the rank that loaded it. rows(images) is collective: every
    rank calls it once a step with the images it encodes (possibly none)."""

    def __init__(self, kind, parts, rank, pixel_values, device, mesh):
        self.rank, self.device, self.mesh = rank, device, mesh
        self.owner = []  # union image -> (rank, its first pixel row there, rows)
        for r, part in enumerate(parts):
            sizes, at = image_sizes(kind, part["grids"]), 0
            for n in sizes:
                self.owner.append((r, at, n))
                at += n
        shapes = {tuple(p["row_shape"]) for p in parts if p["row_shape"] is not None}
        dtypes = {p["dtype"] for p in parts if p["dtype"] is not None}
        if len(shapes) > 1 or len(dtypes) > 1:
            raise ValueError(f"mmsp.patch: the ranks' pixel_values differ in row shape {sorted(shapes)} or dtype "
                             f"{sorted(dtypes)}; every rank's processor must make the same kind of pixels")
        self.row_shape = next(iter(shapes), None)
        self.dtype = getattr(torch, next(iter(dtypes)).split(".")[-1]) if dtypes else None
        self.row_numel = 1
        for d in self.row_shape or ():
            self.row_numel *= d
        self.pixel_values = pixel_values

    def rows(self, images):
        world = dist.get_world_size()
        wants = [None] * world
        _on_world(self.mesh, "all_gather_object (the images each rank encodes)",
                  lambda: dist.all_gather_object(wants, list(images), group=self.mesh.world_group))
        if self.dtype is None:  # no rank loaded an image (every rank knows): nothing to send
            return None
        send, send_counts = [], []
        for q in range(world):  # what q encodes and this rank loaded, in q's order
            mine = [self._local_rows(g) for g in wants[q] if self.owner[g][0] == self.rank]
            send += mine
            send_counts.append(sum(t.numel() for t in mine))
        recv_counts = [sum(self.owner[g][2] for g in images if self.owner[g][0] == q) * self.row_numel
                       for q in range(world)]
        out = torch.empty(sum(recv_counts), dtype=self.dtype, device=self.device)
        inp = torch.cat(send) if send else torch.empty(0, dtype=self.dtype, device=self.device)
        _on_world(self.mesh, "all_to_all_single (pixels to the ranks that encode them)",
                  lambda: dist.all_to_all_single(out, inp, recv_counts, send_counts, group=self.mesh.world_group))
        if not images:
            return None
        # Back into `images` order: from each source rank they came in the order asked.
        by_source, taken, rows = list(out.split(recv_counts)), [0] * world, []
        for g in images:
            source, _, n = self.owner[g]
            rows.append(by_source[source][taken[source]:taken[source] + n * self.row_numel])
            taken[source] += n * self.row_numel
        return torch.cat(rows).view(-1, *self.row_shape)

    def _local_rows(self, g):
        _, first, n = self.owner[g]
        return self.pixel_values[first:first + n].reshape(-1)


def _pixels_part(grids, pixel_values):
    """What the other ranks need of this rank's images (or videos): their grids, and the row
    shape and dtype of its pixels (None when it loaded none)."""
    part = {"grids": grids, "row_shape": None, "dtype": None}
    if pixel_values is not None and pixel_values.shape[0]:
        part["row_shape"] = list(pixel_values.shape[1:])
        part["dtype"] = str(pixel_values.dtype)
    return part


def gather(kind, local, error, pixel_values, pixel_values_videos, device, mesh, model_word=0):
    """Every rank's batch -> (the union batch, its pixel sources {"image": (RoutedPixels, grid
    rows or None)[, "video": ...]}, whether it holds any image or video). `local` is this rank's
    batch in mmsp's format, or None with `error` set. Videos are the union's video blocks
    (mmsp's items: a Qwen3-VL video's temporal patches each its own), each on the rank that
    loaded it, as images are. `model_word`: this rank's model and patch options (batch_fingerprint.model_word),
    which must be every rank's."""
    rank, world = dist.get_rank(), dist.get_world_size()
    part = {"error": error, "sequences": None, "image": _pixels_part([], None), "video": _pixels_part([], None),
            "model": model_word}
    if error is None:
        part["sequences"] = local["sequences"]
        for what, values in (("image", pixel_values), ("video", pixel_values_videos)):
            part[what] = _pixels_part([g for s in local["sequences"] for g in s.get(f"{what}_grid_thw", [])], values)
    parts = [None] * world
    _on_world(mesh, "all_gather_object (every rank's batch)",
              lambda: dist.all_gather_object(parts, part, group=mesh.world_group))
    bad = [(r, p["error"]) for r, p in enumerate(parts) if p["error"] is not None]
    if bad:
        raise ValueError("mmsp.patch (batch='per_rank'): " +
                         "; ".join(f"rank {r}'s batch: {e}" for r, e in bad))
    others = [r for r, p in enumerate(parts) if p["model"] != parts[0]["model"]]
    if others:
        raise ValueError(f"mmsp.patch (batch='per_rank'): rank{'s' if len(others) > 1 else ''} "
                         f"{', '.join(map(str, others))} hold{'' if len(others) > 1 else 's'} another model or patch "
                         "options than rank 0 (its parameters' names, dtypes or shapes, FSDP2, checkpointing, grad "
                         "mode, layout or placement); every rank must patch the same model alike. Stopped before the "
                         "step's collectives, on every rank")
    # rows_of_ranks: which of the union's sequences are whose (the per-token values' rows)
    batch = {"sequences": [s for p in parts for s in p["sequences"]],
             "rows_of_ranks": [len(p["sequences"]) for p in parts]}
    sources, any_item = {}, False
    for what, values in (("image", pixel_values), ("video", pixel_values_videos)):
        grids = [g for p in parts for g in p[what]["grids"]]
        if what == "video" and not grids:
            continue  # every rank knows: no rank calls the videos' (collective) rows
        rows = torch.tensor(grids, dtype=torch.long) if KINDS[kind].encodes_with_grids and grids else None
        sources[what] = (RoutedPixels(kind, [p[what] for p in parts], rank, values, device, mesh), rows)
        any_item = any_item or bool(grids)
    return batch, sources, any_item
