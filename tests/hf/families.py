"""Tiny random models of every family, built and saved by transformers itself, and one
step of data for them: the fixtures of the transformers comparisons (test_reference.py).

Each family starts from mmsp's tiny config (configs/tiny-*.json: the released structure
at width 64) with the vocabulary cut to 640 words and the special token ids moved into
it, so that a model, its gradients and its files stay a few MB. Pixels are drawn in
float32 and held in float64: mmsp reads pixel tensors as float32 (docs/data.md), so both
sides then see the same values.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import torch
from safetensors.torch import save_file

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VOCAB = 640
TEXT_RANGE = (10, 590)  # ordinary words: below every special id


@dataclass
class Family:
    name: str              # configs/tiny-<name>.json
    kind: str              # qwen | llava | internvl: pixel layout and placeholder rule
    image_token: int
    start_token: int = -1  # vision start / end markers (-1: none in the sequence)
    end_token: int = -1
    overrides: dict = field(default_factory=dict)  # config.json changes (top level)
    text_overrides: dict = field(default_factory=dict)  # changes inside text_config


def _qwen(name, nested):
    ids = {"vision_start_token_id": 600, "vision_end_token_id": 601, "image_token_id": 603,
           "video_token_id": 604}
    top = dict(ids)
    text = {"vocab_size": VOCAB}
    if nested:
        text.update({"bos_token_id": 1, "eos_token_id": 2})
    else:
        top.update({"vocab_size": VOCAB, "bos_token_id": 1, "eos_token_id": 2, "vision_token_id": 602})
    return Family(name, "qwen", image_token=603, start_token=600, end_token=601, overrides=top,
                  text_overrides=text if nested else {})


BUILDERS = {
    "qwen2_vl": _qwen("qwen2-vl", nested=False),
    "qwen2_5_vl": _qwen("qwen2_5-vl", nested=False),
    "qwen3_vl": _qwen("qwen3-vl", nested=True),
    "qwen3_5": _qwen("qwen3_5-vl", nested=True),
    "qwen3_vl_moe": _qwen("qwen3-vl-moe", nested=True),
    "qwen3_5_moe": _qwen("qwen3_5-moe", nested=True),
    "llava": Family("llava", "llava", image_token=600, overrides={"image_token_index": 600},
                    text_overrides={"vocab_size": VOCAB}),
    # No image_start_token_id: as in the released InternVL3-*-hf configs. The <img> and
    # </img> words are then ordinary text to both transformers and mmsp.
    "internvl": Family("internvl", "internvl", image_token=603, overrides={"image_token_id": 603},
                       text_overrides={"vocab_size": VOCAB}),
}

# Every model_type mmsp trains, from the C++ registry's table (python/mmsp/families.json): a
# type without a builder above is an error here, not a family the comparisons skip.
with open(os.path.join(REPO, "python", "mmsp", "families.json"), encoding="utf-8") as _table:
    FAMILIES = {model_type: BUILDERS[model_type] for model_type in json.load(_table)["model_types"]}


def config_dict(family: Family) -> dict:
    with open(os.path.join(REPO, "configs", f"tiny-{family.name}.json")) as f:
        cfg = json.load(f)
    cfg.update(family.overrides)
    if family.text_overrides:
        cfg.setdefault("text_config", {}).update(family.text_overrides)
    return cfg


def build_model(family: Family, seed: int = 0):
    """transformers' own model class for the family, random, float64."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    cfg = config_dict(family)
    config = AutoConfig.for_model(**cfg)
    torch.manual_seed(seed)
    # Mixture-of-experts models: transformers' default grouped-mm experts refuse float64;
    # its eager loop over the experts is the reference.
    extra = {"experts_implementation": "eager"} if "num_experts" in cfg.get("text_config", {}) else {}
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float64, **extra)
    # transformers initialises norms to 1 and biases to 0: random values make every
    # gradient, and every mix-up of two weights, visible.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def save_model(model, path: str, shard: str = "200KB") -> None:
    model.save_pretrained(path, max_shard_size=shard)


# --- one step of data -----------------------------------------------------------------------

@dataclass
class Image:
    pixels: torch.Tensor  # float64 holding float32 values: Qwen rows, LLaVA [C,S,S], InternVL [tiles,C,S,S]
    grid: list            # [t, h, w] (patches)
    placeholders: int


@dataclass
class Sample:
    input_ids: list
    loss_mask: list
    images: list


def _pixels(shape, gen):
    return torch.randn(shape, generator=gen, dtype=torch.float32).to(torch.float64)


def make_image(family: Family, cfg: dict, size, gen) -> Image:
    v = cfg["vision_config"]
    if family.kind == "qwen":
        p, tp, m = v["patch_size"], v["temporal_patch_size"], v["spatial_merge_size"]
        h, w = size
        return Image(_pixels((h * w, 3 * tp * p * p), gen), [1, h, w], h * w // (m * m))
    if family.kind == "llava":
        s, p = v["image_size"], v["patch_size"]
        return Image(_pixels((3, s, s), gen), [1, s // p, s // p], cfg["image_seq_length"])
    s, p = v["image_size"][0], v["patch_size"][0]
    tiles = size[0]
    return Image(_pixels((tiles, 3, s, s), gen), [tiles, s // p, s // p], tiles * cfg["image_seq_length"])


def make_samples(family: Family, seed: int = 1) -> list:
    """Two sequences: text, image, text; text, two images, text — the sizes differ, so
    that images cross shard borders on a 4-rank mesh."""
    cfg = config_dict(family)
    gen = torch.Generator().manual_seed(seed)
    sizes = {"qwen": [[(4, 6)], [(2, 2), (4, 4)]], "llava": [[None], [None, None]],
             "internvl": [[(3,)], [(1,), (2,)]]}[family.kind]
    samples = []
    for seq, lengths in zip(sizes, [(9, 7), (5, 6, 4)]):
        ids, mask, images = [1], [0], []
        words = lambda n: torch.randint(*TEXT_RANGE, (n,), generator=gen).tolist()
        for i, size in enumerate(seq):
            t = words(lengths[i])
            ids += t
            mask += [1] * len(t)
            img = make_image(family, cfg, size, gen)
            block = [family.image_token] * img.placeholders
            if family.start_token >= 0:
                block = [family.start_token] + block + [family.end_token]
            ids += block
            mask += [0] * len(block)
            images.append(img)
        t = words(lengths[-1]) + [2]
        ids += t
        mask += [1] * len(t)
        samples.append(Sample(ids, mask, images))
    return samples


def write_jsonl(samples: list, folder: str) -> str:
    """mmsp's data file: the pixels as safetensors entries, grids given."""
    os.makedirs(folder, exist_ok=True)
    tensors, lines = {}, []
    for si, s in enumerate(samples):
        entries = []
        for ii, img in enumerate(s.images):
            key = f"s{si}_i{ii}"
            tensors[key] = img.pixels.contiguous()
            entries.append({"safetensors": "pixels.safetensors", "tensor": key})
        lines.append({"input_ids": s.input_ids, "loss_mask": s.loss_mask, "images": entries,
                      "image_grid_thw": [img.grid for img in s.images]})
    save_file(tensors, os.path.join(folder, "pixels.safetensors"))
    path = os.path.join(folder, "data.jsonl")
    with open(path, "w") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
    return path


# --- transformers' side ---------------------------------------------------------------------

def sequence_output(model, family: Family, s: Sample, router_logits: bool = False):
    """transformers' output of one sequence run on its own (router_logits: a mixture of experts' too)."""
    ids = torch.tensor([s.input_ids])
    kwargs = {}
    if not s.images:
        pass
    elif family.kind == "qwen":
        kwargs["pixel_values"] = torch.cat([img.pixels for img in s.images])
        kwargs["image_grid_thw"] = torch.tensor([img.grid for img in s.images])
        # What the processor returns beside input_ids (1: image token), from which
        # transformers >= 5.x computes the mRoPE positions.
        kwargs["mm_token_type_ids"] = (ids == family.image_token).int()
    elif family.kind == "llava":
        kwargs["pixel_values"] = torch.stack([img.pixels for img in s.images])
    else:
        kwargs["pixel_values"] = torch.cat([img.pixels for img in s.images])
    if router_logits:
        kwargs["output_router_logits"] = True
    return model(input_ids=ids, **kwargs)


def sequence_logits(model, family: Family, s: Sample) -> torch.Tensor:
    """transformers' logits [n, V] of one sequence run on its own."""
    return sequence_output(model, family, s).logits[0]


def aux_loss_of(model, router_logits: list):
    """transformers' own load_balancing_loss_func over the whole step: each sparse layer's
    router logits of every sequence joined, as one padded batch with its attention mask
    gives them (what a training step on the batch adds, times router_aux_loss_coef)."""
    from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import load_balancing_loss_func

    text = model.config.text_config
    layers = tuple(torch.cat([per_sequence[i] for per_sequence in router_logits]) for i in range(len(router_logits[0])))
    return text.router_aux_loss_coef * load_balancing_loss_func(layers, text.num_experts, text.num_experts_per_tok, None)


def reference_loss(model, family: Family, samples: list, logits_out: list | None = None) -> torch.Tensor:
    """The step's loss as mmsp defines it: the mean over every target token of the step
    (token i is a target when loss_mask[i] = 1, predicted at i − 1), each sequence run
    through transformers' forward on its own. The cross-entropy is taken here in
    float64 from transformers' logits (transformers' own loss upcasts to float32). A
    mixture-of-experts model with output_router_logits adds its auxiliary loss over the
    step's tokens (aux_loss_of). `logits_out`: each sequence's logits [n, V] are appended
    to it, detached (the log-prob checks reuse them instead of running the model again)."""
    aux = getattr(model.config.get_text_config(), "output_router_logits", False)
    total, count, router_logits = None, 0, []
    for s in samples:
        out = sequence_output(model, family, s, router_logits=aux)
        logits = out.logits[0]
        if logits_out is not None:
            logits_out.append(logits.detach())
        if aux:
            router_logits.append(out.router_logits)
        labels = torch.tensor(s.input_ids[1:])
        keep = torch.tensor(s.loss_mask[1:], dtype=torch.bool)
        ce = torch.nn.functional.cross_entropy(logits[:-1][keep], labels[keep], reduction="sum")
        total = ce if total is None else total + ce
        count += int(keep.sum())
    return total / count + (aux_loss_of(model, router_logits) if aux else 0)
