"""Is every rank's batch the same one? The check of mmsp.patch(..., batch="shared").

With batch="shared" every rank passes the step's whole batch and plans it alone; a rank given
another batch would plan another step: trained silently wrong when the shapes agree, or dying
in a collective when they do not. So before the step's collectives each rank reduces what it
was given to one 64-bit word per part (PARTS: the batch's tensors, and the patch's options),
and the ranks exchange their words: one all_reduce of a [world, parts] int64 table on the
mesh's world group, each rank filling its own row (so the sum is every row). The table has
the same size whatever the batches are, so ranks whose batches differ in shape or dtype still
exchange alike, within the mesh's timeout. A rank whose words differ from the most common
ones (ties: the lowest rank's) is a ValueError on every rank naming it and the parts. The model
is a part too (model_word): a model in another dtype, with other shapes, sharded, checkpointed
or in grad mode on one rank only would run other collectives than its peers.

What a word covers: a tensor's dtype, shape and every byte of its elements. On the CPU the
word is a 64-bit BLAKE2b hash of the dtype, the shape and the elements' bytes, read in place.
On a GPU the elements are first reduced on the device, so that only 8 bytes a row cross to
the host: each row (dim 0: a patch, a tile, an image, a sequence) becomes one int64, the sum
over its elements of the element's bits (read as an integer of its size) times a fixed odd
64-bit weight per column, wrapping. That is exact integer arithmetic, so the same bytes give
the same word on every rank and device (a float sum would not), and a change of any single
element always changes its row's word (an odd weight times a nonzero difference is nonzero
modulo 2^64); the row words, the dtype and the shape are then hashed. Either way a reordering
of rows or columns changes the word. The ranks must then hold the batch on the same kind of
device (a CPU rank and a GPU rank hash alike tensors differently: named as a difference).
Cost: one pass over the batch, pixels included (measured in docs/python.md).
"""

import hashlib

import torch

from mmsp._extension import C

PARTS = ("input_ids", "attention_mask", "labels", "pixel_values", "image_grid_thw", "pixel_values_videos",
         "video_grid_thw", "second_per_grid_ts", "patch options", "model")
# How a message names a part whose word differs, where its name alone would not say.
_SHOWN = {"model": "model: its parameters' names, dtypes and shapes, FSDP2, checkpointing or grad mode"}
_INTEGER_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_CHUNK = 1 << 22  # elements reduced at a time on a GPU (at most 64 MiB beside them)
_weights: dict[tuple[int, str], torch.Tensor] = {}  # (columns, device) -> int64 [columns], odd


def _column_weights(columns, device):
    key = (columns, str(device))
    if key not in _weights:
        g = torch.Generator().manual_seed(0x6D6D7370)  # fixed: every rank draws the same
        w = torch.randint(-(2 ** 62), 2 ** 62, (columns,), generator=g, dtype=torch.int64) * 2 + 1
        _weights[key] = w.to(device)
    return _weights[key]


def _hash(*pieces):
    h = hashlib.blake2b(digest_size=8)
    for p in pieces:
        h.update(p if isinstance(p, (bytes, memoryview)) else repr(p).encode())
        h.update(b"\0")
    return int.from_bytes(h.digest(), "little", signed=True)


def tensor_word(t):
    """A tensor's word: its dtype, shape and every element (the module's doc)."""
    t = t.detach()
    if t.device.type == "cpu":
        data = t.contiguous().reshape(-1).view(torch.uint8).numpy()
        return _hash(str(t.dtype), tuple(t.shape), memoryview(data))
    return row_sums_word(t)


def row_sums_word(t):
    """The word of a tensor on a GPU (any device: the arithmetic is the same on the CPU)."""
    t = t.detach()
    rows = t.reshape(t.shape[0] if t.dim() else 1, -1).contiguous()
    if rows.element_size() not in _INTEGER_OF_SIZE:
        rows = rows.view(torch.uint8)
    columns, words = rows.shape[1], []
    if rows.numel():
        bits = rows.view(_INTEGER_OF_SIZE[rows.element_size()])
        w = _column_weights(columns, rows.device)
        step = max(1, _CHUNK // max(columns, 1))
        for r in range(0, rows.shape[0], step):
            words.append((bits[r:r + step].to(torch.int64) * w).sum(dim=1))
    summary = torch.cat(words).cpu() if words else torch.zeros(0, dtype=torch.int64)
    return _hash(str(t.dtype), tuple(t.shape), t.device.type, summary.numpy().tobytes())


def model_word(model, fsdp):
    """The model's word: what every rank's model must hold alike for the step's collectives to
    meet (each parameter's name, dtype, shape and requires_grad; FSDP2; activation
    checkpointing; grad mode). A parameter sharded by FSDP2 shows its whole shape."""
    params = [(n, str(p.dtype), tuple(p.shape), p.requires_grad) for n, p in model.named_parameters()]
    return _hash(params, fsdp, bool(getattr(model, "is_gradient_checkpointing", False)), torch.is_grad_enabled())


def word(value):
    """A part's word: a tensor's, or that of a value's repr (None, a list of seconds, options)."""
    if isinstance(value, torch.Tensor):
        return tensor_word(value)
    return _hash(type(value).__name__, value)


def check_same_batch(parts, group, rank, world):
    """Exchanges this rank's words (`parts`: part name -> value, PARTS' names; "model": its
    model_word) over `group` (every rank, mmsp's world group) and raises ValueError on every
    rank when they differ."""
    table = torch.zeros(world, len(PARTS), dtype=torch.int64)
    table[rank] = torch.tensor([parts[name] if name == "model" else word(parts.get(name)) for name in PARTS],
                               dtype=torch.int64)
    try:
        C.all_reduce_(table, group)
    except ValueError as e:
        raise ValueError(f"mmsp.patch (batch='shared'): exchanging the batch fingerprints: {e}") from None
    rows = [tuple(r) for r in table.tolist()]
    counts = {}
    for r, row in enumerate(rows):
        counts.setdefault(row, []).append(r)
    if len(counts) == 1:
        return
    reference = max(counts, key=lambda row: (len(counts[row]), -counts[row][0]))
    first = counts[reference][0]
    differ = []
    for row, ranks in sorted(counts.items(), key=lambda item: item[1][0]):
        if row == reference:
            continue
        names = [_SHOWN.get(PARTS[k], PARTS[k]) for k in range(len(PARTS)) if row[k] != reference[k]]
        who = f"rank {ranks[0]}'s batch differs" if len(ranks) == 1 else \
            f"ranks {', '.join(map(str, ranks))} have batches that differ"
        differ.append(f"{who} from rank {first}'s ({', '.join(names)})")
    raise ValueError(f"mmsp.patch (batch='shared'): {'; '.join(differ)}. With batch='shared' every rank passes "
                     "the same whole batch (and patches the model alike); a loader that gives each rank its own "
                     "batch needs batch='per_rank'. Stopped before the step's collectives, on every rank")
