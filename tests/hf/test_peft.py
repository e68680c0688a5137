"""mmsp's LoRA adapters in peft's hands (docs/finetune-options.md): a model directory
transformers saved, trained one step by `mmsp train --lora-rank 4`, its checkpoint's adapter/
loaded by peft 0.21 onto that base with no missing or unexpected key; the peft model's loss on
the step's batch equals the resumed mmsp run's loss of step 2 (the same batch, the trained
adapters), and the merged hf/ gives transformers the peft model's logits (fp64). Back the other
way: the adapter peft saves is continued by `mmsp train --model ADAPTER_DIR`, whose first loss
is the peft model's. The mixture-of-experts families adapt attention and the shared expert, as
peft's target_modules does on transformers' fused experts."""
import json
import os
import subprocess
import warnings

import pytest
import torch

import families as F
from test_reference import Case, _load_reference

LOSS_RTOL = {"qwen3_5": 5e-9}  # as test_reference.py: Gated DeltaNet in float32 inside transformers
LOSS_RTOL_DEFAULT = 1e-12
# transformers runs the attention's and a router's softmax in float32 inside a float64 model
# (about 1e-8 of each value), and peft's random lora_B (init_lora_weights=False) moves every
# adapted map far from the base: measured up to 1.4e-8 (Qwen3.5-MoE, its router adapted), 1e-9
# to 4e-9 for the others. A wrong target, scale or layer moves the loss by 1e-3 or more.
ALL_LINEAR_RTOL = 5e-8


@pytest.fixture(scope="module", params=F.FAMILIES)
def case(request, tmp_path_factory):
    return Case(request.param, str(tmp_path_factory.mktemp(request.param)))


def _run(case, mmsp_bin, model, out, *extra, ok=True):
    cmd = [mmsp_bin, "train", "--model", model, "--data", case.data, "--steps", "2", "--warmup", "1",
           "--dtype", "float64", "--no-shuffle", "--tokens-per-rank", str(case.tokens), "--lr", "1e-2",
           "--out", out, "--quiet", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if ok:
        assert r.returncode == 0, f"{' '.join(cmd)}\nexit {r.returncode}\n{r.stdout}\n{r.stderr}"
    else:
        assert r.returncode != 0, f"{' '.join(cmd)} was expected to fail\n{r.stdout}"
    return r


def _train(case, mmsp_bin, out, *extra):
    _run(case, mmsp_bin, case.model_dir, out, "--lora-rank", "4", "--lora-alpha", "8", *extra)


def _losses(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [row["loss"] for row in map(json.loads, f) if "loss" in row]


def test_peft_loads_mmsps_adapter_and_computes_mmsps_loss(case, mmsp_bin):
    from peft import PeftConfig, PeftModel, get_peft_model
    from peft.utils import set_peft_model_state_dict
    from safetensors.torch import load_file

    out = os.path.join(case.root, "lora")
    _train(case, mmsp_bin, out, "--stop-after", "1")
    _train(case, mmsp_bin, out, "--resume", out)  # step 2: the trained adapters on the same batch
    mmsp_loss = _losses(out)[-1]
    adapter = os.path.join(out, "step-000001", "adapter")
    # The keys, as peft's own loading sees them: none unexpected, none of the adapters missing.
    base, info = _load_reference(case.model_dir)
    peft_model = get_peft_model(base, PeftConfig.from_pretrained(adapter))
    result = set_peft_model_state_dict(peft_model, load_file(os.path.join(adapter, "adapter_model.safetensors")))
    assert not result.unexpected_keys, result.unexpected_keys
    assert not [k for k in result.missing_keys if "lora_" in k], [k for k in result.missing_keys if "lora_" in k]
    # The user's call, with no warning of missing or unexpected keys.
    base, _ = _load_reference(case.model_dir)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        model = PeftModel.from_pretrained(base, adapter)
    about_keys = [str(w.message) for w in said if "key" in str(w.message).lower()]
    assert not about_keys, about_keys
    loss = F.reference_loss(model, case.family, case.samples).item()
    rtol = LOSS_RTOL.get(case.name, LOSS_RTOL_DEFAULT)
    print(f"{case.name}: peft's loss {loss!r}, mmsp's step 2 {mmsp_loss!r}")
    assert abs(loss - mmsp_loss) <= max(rtol, 5e-9) * abs(mmsp_loss)
    assert loss != pytest.approx(case.loss.item(), rel=1e-6), "the adapters changed nothing"
    merged, merged_info = _load_reference(os.path.join(out, "step-000001", "hf"))
    assert not any(merged_info.values()), merged_info
    with torch.no_grad():
        ids = torch.tensor([case.samples[0].input_ids[:8]])
        want, got = model(input_ids=ids).logits, merged(input_ids=ids).logits
    assert (got - want).abs().max().item() <= 1e-9 * want.abs().max().item()

    # The adapter as peft saves it, continued by mmsp: the first step's loss is peft's. Its base
    # named by a hub id (as a downloaded adapter's is) needs --base-model; a flag that
    # contradicts the adapter is refused.
    saved = os.path.join(case.root, "peft-saved")
    model.save_pretrained(saved)
    config_file = os.path.join(saved, "adapter_config.json")
    with open(config_file) as f:
        config = json.load(f)
    config["base_model_name_or_path"] = "Qwen/not-here"
    with open(config_file, "w") as f:
        json.dump(config, f)
    cont = os.path.join(case.root, "continued")
    r = _run(case, mmsp_bin, saved, cont, "--stop-after", "1", ok=False)
    assert "Qwen/not-here" in r.stderr and "--base-model" in r.stderr, r.stderr
    r = _run(case, mmsp_bin, saved, cont, "--base-model", case.model_dir, "--lora-rank", "8", ok=False)
    assert "--lora-rank 8 contradicts" in r.stderr and "r = 4" in r.stderr, r.stderr
    _run(case, mmsp_bin, saved, cont, "--base-model", case.model_dir, "--stop-after", "1")
    continued = _losses(cont)[0]
    print(f"{case.name}: mmsp continuing peft's adapter, step 1 {continued!r}")
    assert abs(continued - loss) <= max(rtol, 5e-9) * abs(loss)
    with open(os.path.join(cont, "step-000001", "adapter", "adapter_config.json")) as f:
        assert json.load(f)["base_model_name_or_path"] == case.model_dir


def test_mmsp_continues_a_peft_all_linear_adapter(case, mmsp_bin, tmp_path):
    """An adapter peft made itself (`target_modules="all-linear"`: the vision tower's, the
    merger's or projector's and the decoder's linear maps; random lora_A and lora_B), continued
    by `mmsp train --model ADAPTER_DIR`: step 1's loss is the peft model's."""
    from peft import LoraConfig, get_peft_model

    base, _ = _load_reference(case.model_dir)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))
    adapter = str(tmp_path / "all-linear")
    model.save_pretrained(adapter)
    loss = F.reference_loss(model, case.family, case.samples).item()
    out = str(tmp_path / "run")
    _run(case, mmsp_bin, adapter, out, "--stop-after", "1")
    got = _losses(out)[0]
    print(f"{case.name}: peft all-linear {loss!r}, mmsp step 1 {got!r}")
    assert abs(got - loss) <= ALL_LINEAR_RTOL * abs(loss)
