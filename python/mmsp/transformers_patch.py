"""mmsp.patch: a transformers VLM trained with mmsp's sequence parallelism, loop unchanged.

    model = AutoModelForImageTextToText.from_pretrained(path)
    mesh = mmsp.Mesh(ring=2, ulysses=2)
    mmsp.patch(model, mesh)
    loss = model(**batch).loss          # every rank passes the same whole batch
    loss.backward(); optimizer.step()   # = one process on the whole batch

After the patch, the model's forward takes the batch a transformers collator makes
(input_ids [B, T] right-padded, attention_mask, labels with -100, pixel_values,
image_grid_thw; Qwen: pixel_values_videos, video_grid_thw, second_per_grid_ts) on every rank, plans it with mmsp's planner (packing, zigzag or adaptive
placement, mRoPE positions), keeps this rank's slots, and runs the decoder on them with
mmsp's context attention (Ulysses, ring or both) in place of transformers' attention. The
returned loss is the whole batch's (mean over its target tokens, as transformers' own);
its backward gives this rank's part of every gradient, and at the end of the backward the
patch sums the gradients over the world (one all-reduce per dtype), so every rank holds
the gradients one process would. The vision tower runs by Vision DP: each rank encodes
the whole images and videos the plan assigns it (mmsp.ops.route_rows), and their rows travel over
the context group to the ranks whose slots hold their placeholders.

Qwen3.5's Gated DeltaNet layers run sequence-parallel too (their key heads over Ulysses, the
conv and the rule over the ring with state passing; zigzag placement).

Rules: every rank calls forward and backward on the same batch in the same order; labels
are input_ids with -100 where no loss is taken (transformers' causal LM convention).
With batch="per_rank", each rank passes its own batch instead (what a data-parallel loader,
transformers.Trainer's included, gives) and the step is the union of the ranks' batches,
rank 0's first: one process with a batch of world x per-rank samples (mmsp/rank_batches.py).
Under transformers.Trainer the patch keeps accelerate from wrapping the model in DDP and
the Trainer from rescaling its loss.

Gradient accumulation works both ways a loop does it: a backward per micro-batch, or the
micro-batches' losses summed before one backward (each backward's parts are summed over
the mesh once, then added to the gradients the earlier backwards left).

Families: qwen2_vl, qwen2_5_vl, qwen3_vl (deepstack rows sharded with their slots), qwen3_5,
llava, internvl.
"""

import json
import types
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import torch
import torch.nn.functional as F

from mmsp._extension import C as _C
from mmsp.planner import plan as _plan
from mmsp import batch_fingerprint as _fingerprint
from mmsp import ops as _ops
from mmsp import rank_batches as _rank_batches

if TYPE_CHECKING:
    from mmsp.mesh import Mesh

Model = TypeVar("Model", bound=torch.nn.Module)

_ATTENTION = "mmsp"
_current: dict[str, Any] = {}  # the step being computed: {"shard": Shard, "mesh": Mesh}; read by the attention


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention interface -> mmsp.ops.attention on this rank's slots.
    query [1, H, L, D], key/value [1, H_kv, L, D] -> ([1, L, H, D], None)."""
    if query.shape[0] != 1:
        raise ValueError(f"mmsp.patch: attention got a batch of {query.shape[0]} rows; the patched forward "
                         "packs the batch into one row per rank")
    if dropout:
        raise ValueError(f"mmsp.patch: attention dropout {dropout} is not supported (training is exact)")
    step = _current.get("step")
    if step is None:
        raise ValueError("mmsp.patch: the decoder's attention ran outside the patched forward")
    out = _ops.attention(query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1), step["shard"],
                         step["mesh"], causal=True, scale=scaling)
    return out.unsqueeze(0), None


def _gated_deltanet(self, hidden_states, cache_params=None, attention_mask=None, **kwargs):
    """transformers' Qwen3_5GatedDeltaNet.forward on this rank's slots, sequence-parallel:
    the projections here; the key heads spread over Ulysses (mmsp.ops.ulysses_scatter_heads),
    the conv and the gated delta rule over the ring share with state passing (mmsp.ops),
    the heads gathered back, then the gated norm and the output projection."""
    step = _current.get("step")
    if step is None:
        raise ValueError("mmsp.patch: a Gated DeltaNet layer ran outside the patched forward")
    shard, mesh = step["shard"], step["mesh"]
    x = hidden_states[0]  # [L, hidden]
    L = x.shape[0]
    Hk, Hv, K, V = self.num_k_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim
    rep, U = Hv // Hk, mesh.ulysses_size
    q, k, v = torch.split(self.in_proj_qkv(x), [self.key_dim, self.key_dim, self.value_dim], dim=-1)
    b, a = self.in_proj_b(x), self.in_proj_a(x)
    # Per key head, what travels: [q K | k K | v rep·V | b rep | a rep] (value heads h·rep.. belong to key head h).
    mixed = torch.cat([q.view(L, Hk, K), k.view(L, Hk, K), v.view(L, Hk, rep * V), b.view(L, Hk, rep),
                       a.view(L, Hk, rep)], dim=-1)
    heads = Hk // U
    first = mesh.coords.ulysses * heads
    m = _ops.ulysses_scatter_heads(mixed, [L] * U, mesh)  # [T_r, Hk/U, F]: the ring rank's share
    T = m.shape[0]
    q, k, v, b, a = torch.split(m, [K, K, rep * V, rep, rep], dim=-1)
    w = self.conv1d.weight.squeeze(1)  # [q | k | v channels, W]
    w_heads = torch.cat([w[first * K:(first + heads) * K], w[self.key_dim + first * K:self.key_dim + (first + heads) * K],
                         w[2 * self.key_dim + first * rep * V:2 * self.key_dim + (first + heads) * rep * V]])
    qkv = _ops.gated_delta_conv(torch.cat([q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1)], dim=-1), w_heads,
                                shard, mesh)
    q = _l2norm(qkv[:, :heads * K].reshape(T, heads, K)).repeat_interleave(rep, 1)
    k = _l2norm(qkv[:, heads * K:2 * heads * K].reshape(T, heads, K)).repeat_interleave(rep, 1)
    v = qkv[:, 2 * heads * K:].reshape(T, heads * rep, V)
    hv = slice(first * rep, (first + heads) * rep)
    beta = b.reshape(T, heads * rep).sigmoid()
    g = -self.A_log[hv].float().exp() * F.softplus(a.reshape(T, heads * rep).float() + self.dt_bias[hv])
    o = _ops.gated_delta_rule(q, k, v, g.to(q.dtype), beta, shard, mesh)  # [T_r, Hv/U, V]
    o = _ops.ulysses_gather_heads(o, [L] * U, mesh)  # [L, Hv, V]
    z = self.in_proj_z(x).reshape(-1, V)
    o = self.norm(o.reshape(-1, V), z).reshape(1, L, -1)
    return self.out_proj(o)


def _l2norm(x):
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)  # fla's and transformers' l2norm


def _register_attention():
    from transformers import AttentionInterface

    AttentionInterface.register(_ATTENTION, _attention)


@dataclass(frozen=True)
class _Family:
    """What the patch needs of a model's family. `kind` is how its pixels and placeholders
    are laid out: "qwen" (mRoPE, grids), "qwen3" (and deepstack rows), "llava", "internvl"."""
    kind: str
    frames_as_blocks: bool  # each temporal patch of a video its own vision block (Qwen3-VL, Qwen3.5)
    image_token: int
    video_token: int        # -1: the family takes no videos
    merge: int              # patches merged into one placeholder row (Qwen: spatial_merge_size²)


def _family(config: Any) -> _Family:
    """The model's family from the model layer's registry (mmsp._C: the one table of
    families, which `mmsp train` and the planner read), plus what transformers' own config
    says of deepstack. An unsupported model_type is a ValueError listing the supported."""
    try:
        conv = _C.model_conventions(json.dumps(config.to_dict()))
    except ValueError as e:
        raise ValueError(f"mmsp.patch: {e}") from None
    if conv["mrope"]:
        kind = "qwen3" if getattr(config.vision_config, "deepstack_visual_indexes", None) else "qwen"
    elif conv["name"] in ("llava", "internvl"):
        kind = conv["name"]
    else:
        raise ValueError(f"mmsp.patch: model_type {config.model_type!r} ({conv['name']} conventions) is supported by "
                         "mmsp's model layer but not by mmsp.patch yet")
    return _Family(kind, bool(conv["frames_as_blocks"]), int(conv["image_token_id"]), int(conv["video_token_id"]),
                   int(conv["spatial_merge_size"]) ** 2 if conv["mrope"] else 1)


def _video_blocks(family, video_grid_thw, second_per_grid_ts):
    """A batch's videos as the planner's vision blocks, in order: (grid, seconds or None).
    Qwen3-VL and Qwen3.5 put each temporal patch in its own block (after its timestamp
    text), so a video of t temporal patches is t blocks of grid [1, h, w]."""
    grids = video_grid_thw.tolist() if video_grid_thw is not None else []
    seconds = second_per_grid_ts.tolist() if second_per_grid_ts is not None else [None] * len(grids)
    if len(seconds) != len(grids):
        raise ValueError(f"mmsp.patch: second_per_grid_ts has {len(seconds)} entries for {len(grids)} videos")
    if family.frames_as_blocks:
        return [([1, h, w], None) for t, h, w in grids for _ in range(t)]
    return list(zip(grids, seconds))


def _take_blocks(blocks, at, placeholders, merge, what, b):
    """The vision blocks (from `at`) whose placeholder tokens sequence b holds."""
    mine = []
    while placeholders > 0 and at < len(blocks):
        t, h, w = blocks[at][0]
        mine.append(blocks[at])
        placeholders -= t * h * w // merge
        at += 1
    if placeholders != 0:
        raise ValueError(f"mmsp.patch: sequence {b}'s {what} tokens do not match {what}_grid_thw's rows")
    return mine, at


def _sequences(config, family, input_ids, attention_mask, labels, image_grid_thw, video_grid_thw=None,
               second_per_grid_ts=None):
    """The collator's padded batch -> mmsp's batch {"sequences": [...]}, checked."""
    kind = family.kind
    B, T = input_ids.shape
    if labels is None or tuple(labels.shape) != (B, T):
        raise ValueError(f"mmsp.patch: labels {None if labels is None else tuple(labels.shape)} must be given, "
                         f"shaped as input_ids {(B, T)} (-100 where no loss is taken)")
    lengths = [T] * B
    if attention_mask is not None:
        for b in range(B):
            row = attention_mask[b].tolist()
            n = int(sum(row))
            if row != [1] * n + [0] * (T - n):
                raise ValueError(f"mmsp.patch: attention_mask row {b} is not right padding (ones, then zeros); "
                                 "pad on the right")
            lengths[b] = n
    image_token, video_token, merge = family.image_token, family.video_token, family.merge
    grids = image_grid_thw.tolist() if image_grid_thw is not None else []
    per_image = getattr(config, "image_seq_length", None)
    videos = _video_blocks(family, video_grid_thw, second_per_grid_ts)
    if videos and kind not in ("qwen", "qwen3"):
        raise ValueError(f"mmsp.patch: video_grid_thw given to a {kind} model, which takes no videos")
    g, v, sequences = 0, 0, []
    for b in range(B):
        n = lengths[b]
        ids, lab = input_ids[b, :n].tolist(), labels[b, :n].tolist()
        for t, (i, l) in enumerate(zip(ids, lab)):
            if l != -100 and l != i:
                raise ValueError(f"mmsp.patch: labels[{b}, {t}] = {l} differs from input_ids {i}; mmsp trains the "
                                 "next token of the input (labels = input_ids, -100 where no loss is taken)")
        seq = {"input_ids": ids, "loss_mask": [0] + [int(l != -100) for l in lab[1:]]}
        placeholders = sum(1 for i in ids if i == image_token)
        if kind in ("qwen", "qwen3"):
            mine, g = _take_blocks([(grid, None) for grid in grids], g, placeholders, merge, "image", b)
            if mine:
                seq["image_grid_thw"] = [grid for grid, _ in mine]
            frames, v = _take_blocks(videos, v, sum(1 for i in ids if i == video_token), merge, "video", b)
            if frames:
                seq["video_grid_thw"] = [grid for grid, _ in frames]
                if any(sec is not None for _, sec in frames):
                    seq["second_per_grid_ts"] = [sec for _, sec in frames]
        elif placeholders:
            side = config.vision_config.image_size
            side = side[0] if isinstance(side, (list, tuple)) else side
            patch = config.vision_config.patch_size
            patch = patch[0] if isinstance(patch, (list, tuple)) else patch
            if kind == "llava":
                if placeholders % per_image:
                    raise ValueError(f"mmsp.patch: sequence {b} has {placeholders} image tokens, not a multiple of "
                                     f"image_seq_length {per_image}")
                seq["image_grid_thw"] = [[1, side // patch, side // patch]] * (placeholders // per_image)
            else:  # internvl: each run of image tokens is one image of run / image_seq_length tiles
                runs, run = [], 0
                for i in ids + [None]:
                    if i == image_token:
                        run += 1
                    elif run:
                        runs.append(run)
                        run = 0
                seq["image_grid_thw"] = [[r // per_image, side // patch, side // patch] for r in runs]
        sequences.append(seq)
    if kind in ("qwen", "qwen3") and g != len(grids):
        raise ValueError(f"mmsp.patch: image_grid_thw has {len(grids)} rows but the sequences' image tokens use {g}")
    if v != len(videos):
        raise ValueError(f"mmsp.patch: video_grid_thw describes {len(videos)} vision blocks but the sequences' "
                         f"video tokens use {v}")
    return {"sequences": sequences}


def _encode(model, kind, pixel_values, grid_thw, video=False):
    """The tower on some images (or Qwen videos' vision blocks): their placeholder rows in
    order [N, h], and Qwen3-VL's deepstack rows (a list of [N, h]) or None."""
    inner = model.model
    if kind in ("qwen", "qwen3"):
        out = (inner.get_video_features if video else inner.get_image_features)(pixel_values, grid_thw)
        rows = torch.cat(list(out.pooler_output), dim=0)
        return rows, (list(out.deepstack_features) if kind == "qwen3" else None)
    cfg = model.config
    out = inner.get_image_features(pixel_values=pixel_values, vision_feature_layer=cfg.vision_feature_layer,
                                   vision_feature_select_strategy=cfg.vision_feature_select_strategy,
                                   return_dict=True).pooler_output
    if isinstance(out, (list, tuple)):
        out = torch.cat([o.reshape(-1, o.shape[-1]) for o in out], dim=0)
    return out.reshape(-1, out.shape[-1]), None


def _vision_rows(model, kind, shard, mesh, sources, dtype, device, every_rank_encodes=False):
    """Vision DP: this rank encodes the whole images and videos the plan gives it
    (shard.encoder_items), and the rows travel over the context group to the ranks holding
    their placeholders. `sources[kind]` = (pixels, grid rows [n, 3] or None) for "image" and
    "video": `pixels.rows(items)` gives those items' pixel rows (LocalPixels, or RoutedPixels
    for per-rank batches, where it is collective). Returns (rows [V, h], deepstack rows or
    None, their slots [V]).

    every_rank_encodes (under FSDP2, whose sharded tower gathers its weights with collectives in
    the forward and reduce-scatters their gradients in the backward): a rank that encodes no
    item of a kind the step holds encodes that kind's first item anyway and adds its output
    times zero, so every rank runs the tower as often and its gradients are zeros, not None."""
    items = sorted((it for it in shard.plan_json["vision_items"] if it["dp"] == shard.coords["dp"]),
                   key=lambda it: it["item"])
    mine = [items[j] for j in shard.encoder_items]
    width = model.config.text_config.hidden_size
    levels = len(getattr(model.config.vision_config, "deepstack_visual_indexes", []) or []) if kind == "qwen3" else 0
    encoded = {}  # (kind, batch_index) -> (rows, [deepstack rows])
    stand_in = None  # zero: the stand-in encodings' outputs times 0 (every_rank_encodes)
    for what in ("image", "video"):
        chosen = [it for it in mine if it["kind"] == what]
        if what not in sources:
            continue
        pixels, grid_rows = sources[what]
        if not chosen and every_rank_encodes:
            anywhere = [it for it in shard.plan_json["vision_items"] if it["kind"] == what]
            if anywhere:
                first = min(anywhere, key=lambda it: it["batch_index"])
                picked = pixels.rows([first["batch_index"]])
                grid = grid_rows[[first["batch_index"]]] if grid_rows is not None else None
                rows, deep = _encode(model, kind, picked, grid, video=what == "video")
                zero = sum((t.sum() for t in [rows] + list(deep or [])), torch.zeros((), device=device)) * 0
                stand_in = zero if stand_in is None else stand_in + zero
                continue
        picked = pixels.rows([it["batch_index"] for it in chosen])
        if not chosen:
            continue
        grid = grid_rows[[it["batch_index"] for it in chosen]] if grid_rows is not None else None
        rows, deep = _encode(model, kind, picked, grid, video=what == "video")
        sizes = [it["rows"] for it in chosen]
        per_level = [d.split(sizes) for d in deep] if deep is not None else []
        for k, (it, r) in enumerate(zip(chosen, rows.split(sizes))):
            encoded[(what, it["batch_index"])] = (r, [lv[k] for lv in per_level])
    if mine:
        rows = torch.cat([encoded[(it["kind"], it["batch_index"])][0] for it in mine]).to(dtype)
        deep = [torch.cat([encoded[(it["kind"], it["batch_index"])][1][lv] for it in mine]).to(dtype)
                for lv in range(levels)]
    else:  # nothing to encode here: still a part of the graph, so the exchange's backward runs here too
        rows = torch.zeros(0, width, dtype=dtype, device=device, requires_grad=True)
        deep = [rows] * levels
    if stand_in is not None:  # no value changes; the tower's backward runs here too
        rows = rows + stand_in.to(dtype)
    got, slots = _ops.route_rows(torch.cat([rows] + list(deep), dim=1), shard, mesh)
    parts = got.split(width, dim=1)
    return parts[0], (list(parts[1:]) if kind == "qwen3" else None), slots


def _forward(self, input_ids=None, attention_mask=None, labels=None, pixel_values=None, image_grid_thw=None,
             pixel_values_videos=None, video_grid_thw=None, second_per_grid_ts=None, **ignored):
    state = self._mmsp
    kind, mesh = state["family"].kind, state["mesh"]
    fsdp = _under_fsdp(self)
    _recover_from_failed_backward(state)
    if state["pending"] and getattr(self, "is_gradient_checkpointing", False) and torch.is_grad_enabled():
        raise ValueError("mmsp.patch: a forward began before the previous forward's backward, with activation "
                         "checkpointing on: the recompute in that backward would run mmsp's ops on this step's "
                         "layout. Call backward after each forward (gradients still accumulate), or turn "
                         "checkpointing off")
    device = input_ids.device
    if state["batch"] == "shared" and mesh.world is not None:  # the same batch on every rank, or none runs
        _fingerprint.check_same_batch(
            {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels, "pixel_values": pixel_values,
             "image_grid_thw": image_grid_thw, "pixel_values_videos": pixel_values_videos,
             "video_grid_thw": video_grid_thw, "second_per_grid_ts": second_per_grid_ts,
             "patch options": (state["layout"], state["placement"], state["batch"], kind)},
            mesh.world, mesh.rank, mesh.world.size)
    if state["batch"] == "per_rank":  # the step is the union of every rank's batch
        try:
            mine = _sequences(self.config, state["family"], input_ids, attention_mask, labels, image_grid_thw,
                              video_grid_thw, second_per_grid_ts)
            _rank_batches.LocalPixels(kind, [g for q in mine["sequences"] for g in q.get("image_grid_thw", [])],
                                      pixel_values)
            _rank_batches.LocalPixels(kind, [g for q in mine["sequences"] for g in q.get("video_grid_thw", [])],
                                      pixel_values_videos, "pixel_values_videos", "videos")
            error = None
        except ValueError as e:
            mine, error = None, str(e).removeprefix("mmsp.patch: ")
        batch, sources, has_vision = _rank_batches.gather(kind, mine, error, pixel_values, pixel_values_videos,
                                                          device, mesh)
    else:
        batch = _sequences(self.config, state["family"], input_ids, attention_mask, labels, image_grid_thw, video_grid_thw,
                           second_per_grid_ts)
        grids = [g for q in batch["sequences"] for g in q.get("image_grid_thw", [])]
        blocks = [g for q in batch["sequences"] for g in q.get("video_grid_thw", [])]
        sources = {"image": (_rank_batches.LocalPixels(kind, grids, pixel_values), image_grid_thw)}
        if blocks:
            sources["video"] = (_rank_batches.LocalPixels(kind, blocks, pixel_values_videos, "pixel_values_videos",
                                                          "videos"),
                                torch.tensor(blocks, dtype=torch.long))
        has_vision = pixel_values is not None or bool(blocks)
    shard = _plan(state["config"], batch, mesh, layout=state["layout"], placement=state["placement"])
    embed = self.get_input_embeddings()
    x = embed(shard.token_ids.to(device))
    slots, deepstack = [], None
    if has_vision:
        rows, deep, slots = _vision_rows(self, kind, shard, mesh, sources, x.dtype, device,
                                         every_rank_encodes=fsdp)
        x = x.index_put((slots.to(device),), rows)
        if deep is not None:  # transformers adds them at the masked slots in ascending order
            order = torch.argsort(slots)
            deepstack = [d.index_select(0, order.to(device)) for d in deep]
        slots = slots.tolist()
    positions = shard.positions.to(device)
    kwargs = {}
    if kind in ("qwen", "qwen3"):
        positions = positions[:, None, :]  # [3, 1, L]
    if kind == "qwen3":
        mask = torch.zeros(1, x.shape[0], dtype=torch.bool, device=device)
        mask[0, slots] = True
        kwargs = {"visual_pos_masks": mask, "deepstack_visual_embeds": deepstack}
    _current["step"] = {"shard": shard, "mesh": mesh}
    hidden = self.model.language_model(inputs_embeds=x[None], position_ids=positions, attention_mask=None,
                                       use_cache=False, **kwargs).last_hidden_state[0]
    logits = self.lm_head(hidden)
    local = F.cross_entropy(logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits,
                            shard.labels.to(device), ignore_index=-100, reduction="sum") / max(shard.label_count, 1)
    whole = local.detach().clone()
    _world_sum(whole, mesh.world, "the step's loss")
    loss = local + (whole - local.detach())  # the batch's loss; its gradient is this rank's part
    if loss.requires_grad:
        state["pending"] = True
        if fsdp:  # FSDP2 sums the gradients (its reduce-scatter, set to a sum by _under_fsdp)
            loss.register_hook(lambda grad: state.update(pending=False) or grad)
        else:
            state["params"] = [p for p in self.parameters() if p.requires_grad]
            loss.register_hook(lambda grad: _at_backward_start(state) or grad)
    from transformers.modeling_outputs import CausalLMOutputWithPast

    out = CausalLMOutputWithPast(loss=loss, logits=logits[None])
    out.mmsp_shard = shard
    return out


def _at_backward_start(state):
    """Runs when a backward reaches the first patched loss, before any of its gradients
    accumulate (every path to a weight passes through a loss). The gradients earlier
    backwards left (accumulation) step aside, so that the sum over the mesh at the end of this
    backward adds this backward's parts only, each once; then they are added back. A backward
    through several patched losses (summed micro-batches) does this once."""
    state["pending"] = False
    if state["backward"] is not None:
        return
    state["backward"] = [p.grad for p in state["params"]]
    for p in state["params"]:
        p.grad = None
    torch.autograd.Variable._execution_engine.queue_callback(lambda: _sum_gradients(state))


def _sum_gradients(state):
    """At the end of the backward: this backward's parts summed over the world (one
    all-reduce per dtype, mmsp's, on the mesh's world group: a stopped or dead peer ends it
    within the mesh's timeout, naming the group), plus what the earlier backwards held."""
    held, state["backward"] = state["backward"], None
    params, world = state["params"], state["mesh"].world
    state["params"] = []  # not held between steps: FSDP2 may replace them
    for p in params:
        if p.grad is None:  # a weight this rank's slots never reached (e.g. no image here)
            p.grad = torch.zeros_like(p)
    by_dtype = {}
    for p in params:
        by_dtype.setdefault((p.grad.dtype, p.grad.device), []).append(p)
    for group in by_dtype.values():
        flat = torch.cat([p.grad.reshape(-1) for p in group])
        _world_sum(flat, world, f"the gradients ({flat.numel():,} {str(flat.dtype).removeprefix('torch.')} values)")
        at = 0
        for p in group:
            n = p.grad.numel()
            p.grad.copy_(flat[at:at + n].view_as(p.grad))
            at += n
    for p, h in zip(params, held):
        if h is not None:
            p.grad.add_(h)


def _under_fsdp(model) -> bool:
    """Whether FSDP2 (fully_shard) manages some of the model's parameters; if so, every FSDP
    module of it is set to sum its gradients over its mesh, not average them: a rank's gradient
    is its tokens' part of the step's mean loss (whose denominator counts the whole step's
    target tokens, every rank's), so the step's gradient is the plain sum over every rank:
    over sp, dp_shard and dp_replicate alike. Gloo has no PREMUL_SUM, hence the forced sum.
    Checked at every forward: fully_shard may come before or after mmsp.patch."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return False
    found = False
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)
            found = True
    return found


def _world_sum(x, world, what):
    """x summed over every rank in place: mmsp's all_reduce on the mesh's world group (its
    timeout bounds it; a failure names the group, and here what was being summed)."""
    if world is None:
        return
    try:
        _C.all_reduce_(x, world)
    except ValueError as e:
        raise ValueError(f"mmsp.patch: summing {what} over every rank: {e}") from None


def _recover_from_failed_backward(state):
    """A backward that raised never reached its end: its held gradients go back (with
    whatever it had accumulated, as after any failed backward) and the next one starts anew."""
    held, state["backward"] = state["backward"], None
    for p, h in zip(state["params"], held or []):
        if h is not None:
            p.grad = h if p.grad is None else p.grad.add_(h)


_BATCH = ("shared", "per_rank")


def patch(model: Model, mesh: "Mesh", *, layout: str = "zigzag", placement: str = "zigzag",
          batch: Literal["shared", "per_rank"] = "shared") -> Model:
    """Patches a transformers VLM (in place) to train on `mesh`; returns it. See the module doc.
    batch="shared": every rank passes the step's whole batch; "per_rank": each rank passes its
    own (a data-parallel loader's, transformers.Trainer's) and the step is their union."""
    if batch not in _BATCH:
        raise ValueError(f"mmsp.patch: batch={batch!r} is not one of {', '.join(map(repr, _BATCH))}")
    config: Any = model.config
    family = _family(config)
    text = config.text_config
    heads, kv_heads = text.num_attention_heads, text.num_key_value_heads
    from mmsp._extension import C

    C.check_ulysses_heads(heads, kv_heads, mesh.ulysses_size)  # before any collective
    linear: list[Any] = [m for m in model.modules() if type(m).__name__ == "Qwen3_5GatedDeltaNet"]
    if linear:
        C.check_gated_delta_heads(linear[0].num_k_heads, linear[0].num_v_heads, mesh.ulysses_size)
        if placement != "zigzag":
            raise ValueError(f"mmsp.patch: placement {placement!r} with Gated DeltaNet layers is not supported by the "
                             "patch yet (whole segments at home); use placement='zigzag'")
        for m in linear:
            m.forward = types.MethodType(_gated_deltanet, m)
    _register_attention()
    text._attn_implementation = _ATTENTION  # the decoder only; the vision tower keeps its own
    hooked: Any = model  # the attributes below are mmsp's and accelerate's, not nn.Module's
    hooked._mmsp = {"family": family, "mesh": mesh, "config": config.to_dict(), "layout": layout,
                   "placement": placement,
                   "params": [],  # from a forward to its backward's end: the weights whose gradients mmsp sums
                   "backward": None,  # while a backward runs: the gradients held from before it
                   "batch": batch,
                   "pending": False}  # a forward with a graph whose backward has not begun
    hooked.forward = types.MethodType(_forward, model)
    # For transformers.Trainer (through accelerate): the patch sums the gradients itself, so
    # accelerate must not wrap the model in DDP (whose average would come on top: accelerate
    # leaves a model marked prepared as it is), but may shard it with FSDP2 (its plugin), whose
    # reduction the patch then sets to a sum; and the loss it returns is already the step's
    # mean, so the Trainer must not rescale it by the token count it passes
    # (accepts_loss_kwargs = False: it divides by the accumulation steps instead).
    _mark_prepared_unless_fsdp(model)
    hooked.accepts_loss_kwargs = False
    return model


def _accelerate_shards_with_fsdp() -> bool:
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


def _mark_prepared_unless_fsdp(model: torch.nn.Module) -> None:
    """model._is_accelerate_prepared reads True (accelerate leaves the model as it is: no DDP)
    unless accelerate is set up for FSDP, which then prepares it (fully_shard); accelerate's
    own assignment after that is kept. A property needs the class: the model's class becomes a
    subclass of the same name (as fully_shard does), so save_pretrained writes the same
    architecture."""
    cls = type(model)
    if not getattr(cls, "_mmsp_patched_class", False):
        def get(self: Any) -> bool:
            return self.__dict__.get("_mmsp_prepared", False) or not _accelerate_shards_with_fsdp()

        def set_(self: Any, value: bool) -> None:
            self.__dict__["_mmsp_prepared"] = value

        model.__class__ = type(cls.__name__, (cls,), {"_is_accelerate_prepared": property(get, set_),
                                                      "_mmsp_patched_class": True, "__module__": cls.__module__,
                                                      "__qualname__": cls.__qualname__})
