"""What each rank runs in test_finetune.py: mmsp.patch on models whose parts are frozen
(requires_grad_(False)) and on peft's LoRA models (peft.get_peft_model), alone or sharded by
mmsp.fully_shard, against the same model on one process: the loss and every gradient that
exists (fp64), and no gradient where one process has none."""
import copy
import os
import sys

import torch

from sp_checks import ROOT, hf_batch

# The decoder's projections, as LLaMA-Factory targets them when the vision tower is frozen:
# a regular expression over module names, so that the towers' own q_proj / gate_proj stay out.
DECODER_PROJECTIONS = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"


def _vision_parameters(model):
    """Everything outside the language model and its head: the tower and its merger or projector."""
    text = {id(p) for p in model.model.language_model.parameters()} | {id(p) for p in model.lm_head.parameters()}
    return [p for p in model.parameters() if id(p) not in text]


def _lora(model):
    from peft import LoraConfig, get_peft_model

    # init_lora_weights=False: B random too, so that both A's and B's gradients are non-zero
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=DECODER_PROJECTIONS,
                        init_lora_weights=False)
    torch.manual_seed(5)
    return get_peft_model(model, config)


def _assert_same_gradients(model, reference, what, rtol):
    ref = dict(reference.named_parameters())
    checked = 0
    for name, p in model.named_parameters():
        r = ref[name]
        if not r.requires_grad:
            assert p.grad is None, f"{what}: frozen {name} got a gradient"
            continue
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        want = r.grad if r.grad is not None else torch.zeros_like(r)
        err, scale = (g - want).norm().item(), want.norm().item()
        assert err <= rtol * scale + 1e-15, f"{what}: gradient of {name}: |difference| {err:.3e}, |reference| {scale:.3e}"
        checked += 1
    assert checked > 0, f"{what}: no parameter trains"


def frozen_parts_and_peft_equal_one_process(rank, world, family_names, ring, ulysses, fsdp):
    """For each family: (1) its vision tower and merger frozen (LLaMA-Factory's freeze_vision_tower
    with the projector too), (2) peft's LoRA on the decoder's projections; patched on ring x ulysses
    (dp fills the rest; FSDP2 over it when `fsdp`) = the same model on one process."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "hf"))
    from transformers.utils import logging

    import families
    import mmsp

    logging.set_verbosity_error()
    for name in family_names:
        family = families.FAMILIES[name]
        samples = families.make_samples(family)
        for how in ("frozen tower", "peft lora"):
            model = families.build_model(family).train()
            if how == "frozen tower":
                for p in _vision_parameters(model):
                    p.requires_grad_(False)
            else:
                model = _lora(model)
            reference = copy.deepcopy(model)
            want = families.reference_loss(reference, family, samples)
            want.backward()
            mesh = mmsp.Mesh(dp=world // (ring * ulysses), ring=ring, ulysses=ulysses)
            mmsp.patch(model, mesh)
            if fsdp:
                mmsp.fully_shard(model, mesh)
            loss = model(**hf_batch(family, samples)).loss
            loss.backward()
            what = f"{name} ({how}{', FSDP2' if fsdp else ''}) on ring {ring} x ulysses {ulysses}, rank {rank}"
            loss_rtol, grad_rtol = (5e-9, 1e-4) if name == "qwen3_5" else (1e-12, 1e-9)  # as test_patch.py
            assert abs(loss.item() - want.item()) <= loss_rtol * abs(want.item()), \
                f"{what}: loss {loss.item()!r} != {want.item()!r}"
            _assert_same_gradients(model, reference, what, grad_rtol)
