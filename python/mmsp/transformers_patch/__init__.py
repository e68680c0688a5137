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
rank 0's first: one process with a batch of world x per-rank samples (transformers_patch/rank_batches.py).
Under transformers.Trainer the patch keeps accelerate from wrapping the model in DDP and
the Trainer from rescaling its loss.

Gradient accumulation works both ways a loop does it: a backward per micro-batch, or the
micro-batches' losses summed before one backward (each backward's parts are summed over
the mesh once, then added to the gradients the earlier backwards left).

Frozen parts (`requires_grad_(False)`) and PEFT models (`peft.get_peft_model(model, config)`,
then `mmsp.patch(peft_model, mesh)`) train exactly as one process: only the parameters that
require a gradient are summed over the mesh, and a frozen vision tower's rows carry none.

Mixture-of-experts models (qwen3_vl_moe, qwen3_5_moe): transformers' sparse blocks on this
rank's slots; with mmsp.Mesh(..., expert=E) each rank of an expert group runs its block of
the experts on the group's tokens (all-to-all-v each way); the auxiliary load-balancing loss
over the whole step when the config's output_router_logits is on (transformers_patch/experts.py).

Families: qwen2_vl, qwen2_5_vl, qwen3_vl (deepstack rows sharded with their slots), qwen3_5,
qwen3_vl_moe, qwen3_5_moe, llava, internvl.
"""

from typing import TYPE_CHECKING, Any, Literal, TypeVar

import torch

if TYPE_CHECKING:
    from mmsp.mesh import Mesh

__all__ = ["patch"]

Model = TypeVar("Model", bound=torch.nn.Module)

_BATCH = ("shared", "per_rank")


def patch(model: Model, mesh: "Mesh", *, layout: str = "zigzag", placement: str = "zigzag",
          batch: Literal["shared", "per_rank"] = "shared") -> Model:
    """Patches a transformers VLM (in place) to train on `mesh`; returns it. See the module doc.
    batch="shared": every rank passes the step's whole batch; "per_rank": each rank passes its
    own (a data-parallel loader's, transformers.Trainer's) and the step is their union.
    `model` may be a peft.PeftModel (LoRA adapters): the transformers model inside it is patched,
    and parameters with requires_grad False (frozen parts, a LoRA base) stay out of the sums."""
    if batch not in _BATCH:
        raise ValueError(f"mmsp.patch: batch={batch!r} is not one of {', '.join(map(repr, _BATCH))}")
    wrapper: Any = model
    if callable(getattr(wrapper, "get_base_model", None)):
        # A peft.PeftModel: its forward reaches the transformers model's, which the patch
        # replaces; the LoRA layers sit inside that model's modules and run as they are.
        _patch_model(wrapper.get_base_model(), mesh, layout, placement, batch)
        return model
    _patch_model(model, mesh, layout, placement, batch)
    return model


def _patch_model(model: torch.nn.Module, mesh: "Mesh", layout: str, placement: str, batch: str) -> None:
    import types

    from mmsp._extension import C
    from mmsp.transformers_patch import attention, experts, linear_attention, step
    from mmsp.transformers_patch.accelerate_hooks import mark_prepared_unless_fsdp
    from mmsp.transformers_patch.families import family_of
    from mmsp.transformers_patch.state import PatchState
    from mmsp.transformers_patch.token_values import fused_head_temperature

    config: Any = model.config
    family = family_of(config)
    text = config.text_config
    C.check_ulysses_heads(text.num_attention_heads, text.num_key_value_heads, mesh.ulysses_size)  # before any collective
    linear = linear_attention.linear_layers(model)
    if linear:
        C.check_gated_delta_heads(linear[0].num_k_heads, linear[0].num_v_heads, mesh.ulysses_size)
        if placement != "zigzag":
            raise ValueError(f"mmsp.patch: placement {placement!r} with Gated DeltaNet layers is not supported by the "
                             "patch yet (whole segments at home); use placement='zigzag'")
        linear_attention.install(linear)
    has_experts = experts.install(model, mesh)
    attention.register()
    text._attn_implementation = attention.NAME  # the decoder only; the vision tower keeps its own
    hooked: Any = model  # the attributes below are mmsp's and accelerate's, not nn.Module's
    hooked._mmsp = PatchState(family=family, mesh=mesh, config=config.to_dict(), layout=layout, placement=placement,
                              batch=batch, temperature=fused_head_temperature(model.forward), experts=has_experts)
    hooked.forward = types.MethodType(step.forward, model)
    # For transformers.Trainer (accelerate_hooks.py); and the loss the patch returns is already
    # the step's mean, so the Trainer must not rescale it by the token count it passes
    # (accepts_loss_kwargs = False: it divides by the accumulation steps instead).
    mark_prepared_unless_fsdp(model)
    hooked.accepts_loss_kwargs = False
