"""The patched forward: the collator's batch planned by mmsp (packing, placement, mRoPE
positions), this rank's slots embedded, the vision rows routed in, the decoder run on the
slots with mmsp's attention, and the batch's loss whose backward gives this rank's part of
every gradient (summed over the world by gradients.py or FSDP2)."""

import torch
import torch.nn.functional as F

from mmsp import op_agreement as _agreement
from mmsp.planner import plan as _plan
from mmsp.transformers_patch import batch as _batch
from mmsp.transformers_patch import batch_fingerprint as _fingerprint
from mmsp.transformers_patch import experts as _experts
from mmsp.transformers_patch import gradients as _gradients
from mmsp.transformers_patch import rank_batches as _rank_batches
from mmsp.transformers_patch import token_values as _token_values
from mmsp.transformers_patch.state import PatchState, Routers, Step, set_step
from mmsp.transformers_patch.vision import vision_rows


def _check_no_pending_recompute(model, state: PatchState) -> None:
    if state.pending and getattr(model, "is_gradient_checkpointing", False) and torch.is_grad_enabled():
        raise ValueError("mmsp.patch: a forward began before the previous forward's backward, with activation "
                         "checkpointing on: the recompute in that backward would run mmsp's ops on this step's "
                         "layout. Call backward after each forward (gradients still accumulate), or turn "
                         "checkpointing off")


def _vocabulary(model) -> int:
    return model.get_input_embeddings().num_embeddings


def _shared_batch(model, state: PatchState, inputs: dict, fsdp: bool):
    """Every rank passed the step's whole batch: checked alike (its fingerprint agreed first,
    with the model's and the patch options', so every check after it fails on every rank)."""
    kind, mesh = state.family.kind, state.mesh
    if mesh.world is not None:  # the same batch on every rank, or none runs
        _fingerprint.check_same_batch(
            {**inputs, "patch options": (state.layout, state.placement, state.batch, kind),
             "model": _fingerprint.model_word(model, fsdp)},
            mesh.world, mesh.rank, mesh.world.size)
    batch = _batch.sequences(model.config, state.family, _vocabulary(model), **inputs)
    grids = [g for q in batch["sequences"] for g in q.get("image_grid_thw", [])]
    blocks = [g for q in batch["sequences"] for g in q.get("video_grid_thw", [])]
    sources = {"image": (_rank_batches.LocalPixels(kind, grids, inputs["pixel_values"]), inputs["image_grid_thw"])}
    if blocks:
        sources["video"] = (_rank_batches.LocalPixels(kind, blocks, inputs["pixel_values_videos"],
                                                      "pixel_values_videos", "videos"),
                            torch.tensor(blocks, dtype=torch.long))
    return batch, sources, inputs["pixel_values"] is not None or bool(blocks)


def _per_rank_batch(model, state: PatchState, inputs: dict, device, fsdp: bool):
    """Each rank passed its own batch: the step is their union (rank_batches.py); the ranks'
    models and patch options are compared there too."""
    kind = state.family.kind
    try:
        mine = _batch.sequences(model.config, state.family, _vocabulary(model), **inputs)
        _rank_batches.LocalPixels(kind, [g for q in mine["sequences"] for g in q.get("image_grid_thw", [])],
                                  inputs["pixel_values"])
        _rank_batches.LocalPixels(kind, [g for q in mine["sequences"] for g in q.get("video_grid_thw", [])],
                                  inputs["pixel_values_videos"], "pixel_values_videos", "videos")
        error = None
    except ValueError as e:
        mine, error = None, str(e).removeprefix("mmsp.patch: ")
    model_word = _fingerprint.model_word(model, fsdp) ^ _fingerprint.word((state.layout, state.placement, kind))
    return _rank_batches.gather(kind, mine, error, inputs["pixel_values"], inputs["pixel_values_videos"], device,
                                state.mesh, model_word)


@torch.compiler.disable  # mmsp's all-reduce and a backward hook: eager under torch.compile(model)
def _batch_loss(local: torch.Tensor, state: PatchState, model, fsdp: bool) -> torch.Tensor:
    """This rank's part of the mean loss -> the batch's loss, whose gradient is this rank's part."""
    whole = local.detach().clone()
    _gradients.world_sum(whole, state.mesh.world, "the step's loss")
    loss = local + (whole - local.detach())
    if loss.requires_grad:
        state.pending = True
        if not fsdp:  # else FSDP2 sums the gradients (its reduce-scatter, set to a sum by under_fsdp)
            state.params = [p for p in model.parameters() if p.requires_grad]

        def backward_begins(grad: torch.Tensor) -> torch.Tensor:
            if fsdp:
                state.pending = False
            else:
                _gradients.at_backward_start(state)
            return grad

        loss.register_hook(backward_begins)
    return loss


@torch.compiler.disable  # host work on the batch (checks, hashes, the plan): eager under torch.compile(model)
def _planned_step(model, state: PatchState, inputs: dict, device, fsdp: bool):
    """The step's batch checked (agreed across the ranks) and planned: (this rank's shard, the
    pixel sources, whether the step holds images or videos)."""
    if state.batch == "per_rank":
        batch, sources, has_vision = _per_rank_batch(model, state, inputs, device, fsdp)
    else:
        batch, sources, has_vision = _shared_batch(model, state, inputs, fsdp)
    shard = _plan(state.config, batch, state.mesh, layout=state.layout, placement=state.placement)
    state.step_layout = _token_values.StepLayout.of(batch, state.mesh.rank)
    return shard, sources, has_vision


def _decoder_logits(model, state: PatchState, shard, sources, has_vision: bool, device, fsdp: bool,
                    head: bool = True):
    """This rank's slots embedded, the vision rows routed in, the decoder and the head: logits [L, V]
    (head=False: the final hidden states [L, h], for token_values.py's chunked head), and (mixture
    of experts) this rank's share of the auxiliary loss, or None."""
    kind, mesh, rules = state.family.kind, state.mesh, state.family.rules
    x = model.get_input_embeddings()(shard.token_ids.to(device))
    slots, deepstack = [], None
    if has_vision:
        rows, deep, slot_tensor = vision_rows(model, kind, shard, mesh, sources, x.dtype, device,
                                              every_rank_encodes=fsdp)
        x = x.index_put((slot_tensor.to(device),), rows)
        if deep is not None:  # transformers adds them at the masked slots in ascending order
            order = torch.argsort(slot_tensor)
            deepstack = [d.index_select(0, order.to(device)) for d in deep]
        slots = slot_tensor.tolist()
    positions, kwargs = rules.decoder_inputs(shard.positions.to(device), slots, x.shape[0], deepstack, device)
    routers = Routers() if state.experts else None
    set_step(Step(shard, mesh, routers))
    hidden = model.model.language_model(inputs_embeds=x[None], position_ids=positions, attention_mask=None,
                                        use_cache=False, **kwargs).last_hidden_state[0]
    aux = None
    if routers is not None:
        routers.open = False
        real = torch.nonzero(shard.sequence >= 0).view(-1).to(device)
        aux = _experts.aux_share(model, routers.logits, real, mesh.world)
        routers.logits = []
    return (model.lm_head(hidden) if head else hidden), aux


def forward(self, input_ids=None, attention_mask=None, labels=None, pixel_values=None, image_grid_thw=None,
            pixel_values_videos=None, video_grid_thw=None, second_per_grid_ts=None, return_token_logprobs=False,
            return_token_entropy=False, temperature=None, fused_lm_head=False, **ignored):
    state: PatchState = self._mmsp
    mesh = state.mesh
    fsdp = _gradients.under_fsdp(self, mesh.timeout)
    _gradients.recover_from_failed_backward(state)
    _check_no_pending_recompute(self, state)
    device = input_ids.device
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels,
              "pixel_values": pixel_values, "image_grid_thw": image_grid_thw,
              "pixel_values_videos": pixel_values_videos, "video_grid_thw": video_grid_thw,
              "second_per_grid_ts": second_per_grid_ts}
    shard, sources, has_vision = _planned_step(self, state, inputs, device, fsdp)
    if return_token_logprobs or return_token_entropy or fused_lm_head:  # per-token values (token_values.py)
        with _agreement.agreed():
            # per-token values are the policy's alone: a mixture of experts' auxiliary loss is not among them
            hidden, _ = _decoder_logits(self, state, shard, sources, has_vision, device, fsdp, head=False)
        return _token_values.token_values(
            self, state, shard, hidden, labels, attention_mask, fsdp=fsdp, batch_loss=_batch_loss,
            temperature=state.temperature if temperature is None else temperature,
            entropy=return_token_entropy, fused=fused_lm_head)
    with _agreement.agreed():  # agreed once for the step (the batch check): its ops skip their own
        logits, aux = _decoder_logits(self, state, shard, sources, has_vision, device, fsdp)
    local = F.cross_entropy(logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits,
                            shard.labels.to(device), ignore_index=-100, reduction="sum") / max(shard.label_count, 1)
    if aux is not None:  # the auxiliary load-balancing loss: this rank's share (experts.py)
        local = local + aux.to(local.dtype)
    loss = _batch_loss(local, state, self, fsdp)
    from transformers.modeling_outputs import CausalLMOutputWithPast

    out = CausalLMOutputWithPast(loss=loss, logits=logits[None])
    out.mmsp_shard = shard
    return out
