"""Vision DP under mmsp.patch: this rank encodes the whole images and videos the plan gives it
(shard.encoder_items) with the model's own tower, and the rows travel over the context group
to the ranks whose slots hold their placeholders (mmsp.ops.route_rows)."""

import torch

from mmsp import ops as _ops
from mmsp.transformers_patch.families import KINDS
from mmsp.transformers_patch.families.qwen import deepstack_levels


def _stand_in(rules, model, pixels, grid_rows, shard, what, device):
    """Under FSDP2: the kind's first item encoded here although no item of it is this rank's,
    its output times zero (the tower's collectives and backward then run on every rank)."""
    anywhere = [it for it in shard.plan_json["vision_items"] if it["kind"] == what]
    if not anywhere:
        return None
    first = min(anywhere, key=lambda it: it["batch_index"])
    picked = pixels.rows([first["batch_index"]])
    grid = grid_rows[[first["batch_index"]]] if grid_rows is not None else None
    rows, deep = rules.encode(model, picked, grid, video=what == "video")
    return sum((t.sum() for t in [rows] + list(deep or [])), torch.zeros((), device=device)) * 0


def _vision_trains(model) -> bool:
    """Whether any parameter outside the language model and its head requires a gradient (the
    tower, its merger or projector): then the rows an encoding rank sends carry one, and every
    rank's exchange must run its backward, alike. A frozen tower's rows carry none anywhere."""
    text = {id(p) for p in model.model.language_model.parameters()} | {id(p) for p in model.lm_head.parameters()}
    return torch.is_grad_enabled() and any(p.requires_grad for p in model.parameters() if id(p) not in text)


def vision_rows(model, kind, shard, mesh, sources, dtype, device, every_rank_encodes=False):
    """Returns (rows [V, h], deepstack rows or None, their slots [V]). `sources[kind]` =
    (pixels, grid rows [n, 3] or None) for "image" and "video": `pixels.rows(items)` gives those
    items' pixel rows (LocalPixels, or RoutedPixels for per-rank batches, where it is collective).

    every_rank_encodes (under FSDP2, whose sharded tower gathers its weights with collectives in
    the forward and reduce-scatters their gradients in the backward): a rank that encodes no
    item of a kind the step holds encodes that kind's first item anyway and adds its output
    times zero, so every rank runs the tower as often and its gradients are zeros, not None."""
    rules = KINDS[kind]
    items = sorted((it for it in shard.plan_json["vision_items"] if it["dp"] == shard.coords["dp"]),
                   key=lambda it: it["item"])
    mine = [items[j] for j in shard.encoder_items]
    width = model.config.text_config.hidden_size
    levels = deepstack_levels(model.config) if rules.deepstack else 0
    encoded = {}  # (kind, batch_index) -> (rows, [deepstack rows])
    stand_in = None  # zero: the stand-in encodings' outputs times 0 (every_rank_encodes)
    for what in ("image", "video"):
        chosen = [it for it in mine if it["kind"] == what]
        if what not in sources:
            continue
        pixels, grid_rows = sources[what]
        if not chosen and every_rank_encodes:
            zero = _stand_in(rules, model, pixels, grid_rows, shard, what, device)
            if zero is not None:
                stand_in = zero if stand_in is None else stand_in + zero
                continue
        picked = pixels.rows([it["batch_index"] for it in chosen])
        if not chosen:
            continue
        grid = grid_rows[[it["batch_index"] for it in chosen]] if grid_rows is not None else None
        rows, deep = rules.encode(model, picked, grid, video=what == "video")
        sizes = [it["rows"] for it in chosen]
        per_level = [d.split(sizes) for d in deep] if deep is not None else []
        for k, (it, r) in enumerate(zip(chosen, rows.split(sizes))):
            encoded[(what, it["batch_index"])] = (r, [lv[k] for lv in per_level])
    if mine:
        rows = torch.cat([encoded[(it["kind"], it["batch_index"])][0] for it in mine]).to(dtype)
        deep = [torch.cat([encoded[(it["kind"], it["batch_index"])][1][lv] for it in mine]).to(dtype)
                for lv in range(levels)]
    else:  # nothing to encode here: still a part of the graph, so the exchange's backward runs here too
        # (only when the tower's rows carry a gradient anywhere: a frozen tower's exchange has no backward)
        rows = torch.zeros(0, width, dtype=dtype, device=device, requires_grad=_vision_trains(model))
        deep = [rows] * levels
    if stand_in is not None:  # no value changes; the tower's backward runs here too
        rows = rows + stand_in.to(dtype)
    got, slots = _ops.route_rows(torch.cat([rows] + list(deep), dim=1), shard, mesh)
    parts = got.split(width, dim=1)
    return parts[0], (list(parts[1:]) if rules.deepstack else None), slots
