"""What each rank runs in test_fsdp.py: mmsp.patch composed with FSDP2 (fully_shard on the
folded dp_shard x sp DeviceMesh) and with activation checkpointing, two optimizer steps,
against transformers' unpatched model on one process (fp64)."""
import os
import sys

import torch

from sp_checks import ROOT, hf_batch

LR = 0.5  # SGD: an error in a gradient shows in the weights as it is


def _full(t):
    """A DTensor (FSDP2's sharded parameter or gradient) gathered whole; a tensor as it is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def shard_with_fsdp2(model, mesh, mp_policy=None):
    """mmsp.fully_shard: each decoder layer and vision block (transformers' _no_split_modules),
    then the root, over mesh.fsdp_mesh()."""
    import mmsp

    mmsp.fully_shard(model, mesh, **({"mp_policy": mp_policy} if mp_policy is not None else {}))


def _train(model, step_loss, steps):
    """`steps` SGD steps, each on step_loss(model); returns (the losses, every weight and the
    last step's gradients, whole, by name)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = step_loss(model)
        loss.backward()
        losses.append(loss.item())
        optimizer.step()
    weights = {n: _full(p.detach()).clone() for n, p in model.named_parameters()}
    grads = {n: _full(p.grad).clone() for n, p in model.named_parameters() if p.grad is not None}
    return losses, weights, grads


def _assert_equal(got, want, what, rtol):
    for name, w in want.items():
        g = got.get(name, torch.zeros_like(w))
        err, scale = (g - w).norm().item(), w.norm().item()
        assert err <= rtol * scale + 1e-15, f"{what}: {name}: |difference| {err:.3e}, |reference| {scale:.3e}"


def _with_kv_heads(family, kv_heads):
    """The family with kv_heads K/V heads (and, for Qwen3.5, Gated DeltaNet key heads), so
    that Ulysses over 4 ranks splits them (mmsp does not replicate K/V heads)."""
    import dataclasses

    if family.text_overrides:  # a nested text_config (Qwen3.5)
        return dataclasses.replace(family, text_overrides={**family.text_overrides, "num_key_value_heads": kv_heads,
                                                           "linear_num_key_heads": kv_heads})
    return dataclasses.replace(family, overrides={**family.overrides, "num_key_value_heads": kv_heads})


def fsdp_equals_one_process(rank, world, family_names, shape, names, combos, steps=2, kv_heads=None,
                            shard_first=False):
    """For each family and each (fsdp, checkpointing) in combos: the model patched by mmsp on
    the DeviceMesh `shape` (dimension `names`), two SGD steps = transformers' model on one
    process (every weight, the last step's gradients and the losses). Qwen3.5's Gated DeltaNet
    runs in float32 inside transformers (mmsp: fp64), so that family's reference is mmsp
    without FSDP2 and checkpointing on the same mesh (itself = transformers to 1e-4:
    test_patch.py), and every other combination equals it to 1e-9. shard_first: fully_shard
    before mmsp.patch (and checkpointing last), the other order a user may take."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "hf"))
    from torch.distributed.device_mesh import init_device_mesh
    from transformers.utils import logging

    import families
    import mmsp

    logging.set_verbosity_error()
    mesh = mmsp.Mesh.from_device_mesh(init_device_mesh("cpu", shape, mesh_dim_names=names))
    fsdp_mesh = mesh.fsdp_mesh()
    assert fsdp_mesh is mesh.fsdp_mesh(), "fsdp_mesh() makes its DeviceMesh once"
    assert fsdp_mesh.ndim == (2 if "dp_replicate" in names else 1), f"fsdp_mesh {fsdp_mesh} on {names}"
    assert fsdp_mesh.size() == world, f"fsdp_mesh {fsdp_mesh} does not span the {world} ranks"
    for name in family_names:
        family = families.FAMILIES[name]
        if kv_heads is not None:
            family = _with_kv_heads(family, kv_heads)
        samples = families.make_samples(family)
        want = _train(families.build_model(family).train(),
                      lambda m: families.reference_loss(m, family, samples), steps)
        baseline = None
        for fsdp, checkpointing in combos:
            model = families.build_model(family).train()
            if fsdp and shard_first:
                shard_with_fsdp2(model, mesh)
            mmsp.patch(model, mesh)
            if checkpointing:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if fsdp and not shard_first:
                shard_with_fsdp2(model, mesh)
                sharded = next(model.parameters())
                assert type(sharded).__name__ == "DTensor", f"{name}: fully_shard left {type(sharded).__name__}"
            got = _train(model, lambda m: m(**hf_batch(family, samples)).loss, steps)
            what = (f"{name} on {dict(zip(names, shape))}, FSDP2 {'on' if fsdp else 'off'}, checkpointing "
                    f"{'on' if checkpointing else 'off'}, rank {rank}")
            if name == "qwen3_5":
                if baseline is None:
                    assert not fsdp and not checkpointing, "the first combination is the baseline"
                    _assert_equal(got[1], want[1], what + " (weights, vs transformers' float32 rule)", 1e-4)
                    baseline = got
                    continue
                ref, rtol = baseline, 1e-9
            else:
                ref, rtol = want, 1e-9
            assert all(abs(g - w) <= 1e-12 * abs(w) for g, w in zip(got[0], ref[0])), \
                f"{what}: losses {got[0]} != {ref[0]}"
            _assert_equal(got[1], ref[1], what + " (weights after the steps)", rtol)
            _assert_equal(got[2], ref[2], what + " (the last step's gradients)", rtol)
            del model


def fsdp_mixed_precision_trains(rank, world, family_name, shape, names):
    """FSDP2's MixedPrecisionPolicy (bf16 compute, fp32 reduce) under mmsp.patch on fp32
    weights: two steps run, the gradients are reduced and held in fp32, and the losses and
    gradients stay within bf16's precision of the fp32 run without FSDP2 on the same mesh."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "hf"))
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from transformers.utils import logging

    import families
    import mmsp

    logging.set_verbosity_error()
    mesh = mmsp.Mesh.from_device_mesh(init_device_mesh("cpu", shape, mesh_dim_names=names))
    family = families.FAMILIES[family_name]
    samples = families.make_samples(family)
    runs = []
    for policy in (None, MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)):
        model = families.build_model(family).float().train()
        mmsp.patch(model, mesh)
        if policy is not None:
            shard_with_fsdp2(model, mesh, policy)
        runs.append(_train(model, lambda m: m(**hf_batch(family, samples)).loss, 2))
    (want_losses, _, want_grads), (losses, _, grads) = runs
    what = f"{family_name} on {dict(zip(names, shape))}, bf16 compute under FSDP2, rank {rank}"
    assert all(g.dtype == torch.float32 for g in grads.values()), f"{what}: gradients not fp32"
    assert all(abs(g - w) <= 2e-3 * abs(w) for g, w in zip(losses, want_losses)), f"{what}: {losses} vs {want_losses}"
    for name, w in want_grads.items():
        g = grads[name]
        cosine = (g.double() * w.double()).sum() / (g.double().norm() * w.double().norm() + 1e-30)
        assert w.norm() == 0 or cosine > 0.98, f"{what}: {name}'s gradient points elsewhere (cosine {cosine:.4f})"


def device_mesh_mistakes_named(rank, world):
    """A DeviceMesh mmsp cannot use, and a second forward before the backward with
    checkpointing on: a ValueError on every rank naming the rule, before any collective."""
    import pytest

    sys.path.insert(0, os.path.join(ROOT, "tests", "hf"))
    from torch.distributed.device_mesh import init_device_mesh
    from transformers.utils import logging

    import families
    import mmsp

    logging.set_verbosity_error()
    swapped = init_device_mesh("cpu", (2, 2), mesh_dim_names=("ulysses", "ring"))
    with pytest.raises(ValueError, match=r"are not mmsp's layout: .*ulysses innermost"):
        mmsp.Mesh.from_device_mesh(swapped)
    with pytest.raises(ValueError, match=r"ring='cp' is not a dimension of the DeviceMesh \(its dimensions: "
                                         r"ulysses, ring\)"):
        mmsp.Mesh.from_device_mesh(swapped, ring="cp")
    with pytest.raises(ValueError, match="has no mesh_dim_names"):
        mmsp.Mesh.from_device_mesh(init_device_mesh("cpu", (world,)))
    hsdp = mmsp.Mesh.from_device_mesh(init_device_mesh("cpu", (2, 1, 2), mesh_dim_names=("dp_replicate", "dp_shard",
                                                                                           "ulysses")))
    assert (hsdp.dp, hsdp.ring_size, hsdp.ulysses_size) == (2, 1, 2), hsdp
    folded = hsdp.fsdp_mesh()
    assert folded.mesh_dim_names == ("dp_replicate", "dp_shard_sp") and tuple(folded.mesh.shape) == (2, 2), folded
    with pytest.raises(ValueError, match="'dp_replicate' must be the DeviceMesh's first dimension for HSDP"):
        mmsp.Mesh.from_device_mesh(init_device_mesh("cpu", (2, 2), mesh_dim_names=("ring", "dp_replicate")),
                                   ring=None).fsdp_mesh()
    mesh = mmsp.Mesh.from_device_mesh(init_device_mesh("cpu", (2, 2), mesh_dim_names=("ring", "ulysses")))
    assert (mesh.dp, mesh.ring_size, mesh.ulysses_size) == (1, 2, 2), mesh
    family = families.FAMILIES["qwen2_5_vl"]
    samples = families.make_samples(family)
    model = mmsp.patch(families.build_model(family).train(), mesh)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    first = model(**hf_batch(family, samples[:1])).loss
    with pytest.raises(ValueError, match="a forward began before the previous forward's backward, with activation "
                                         "checkpointing on"):
        model(**hf_batch(family, samples[1:]))
    first.backward()  # then the loop goes on
    model(**hf_batch(family, samples[1:])).loss.backward()
    model.zero_grad(set_to_none=True)
    mmsp.fully_shard(model, mesh)  # a second fully_shard: a short ValueError, not FSDP2's AssertionError
    with pytest.raises(ValueError, match=r"^mmsp.fully_shard: the model is already sharded by FSDP2 \(\w+\); shard it "
                                         r"once$"):
        mmsp.fully_shard(model, mesh)
