"""The model directory: its processor (transformers' own, loaded offline) and what config.json
says the trainer will expect of the tokens (the family, its vision token ids, its grid rules).

Everything that can be checked once is checked here, before any record is read, naming the
file and the value: a config.json and a processor that disagree would otherwise give a
`.jsonl` that mmsp refuses (or, worse, trains on wrongly).
"""
import json
import os
from dataclasses import dataclass
from typing import Any

from .errors import PrepareError
from .reader import read_json_file

# config.json's bytes at most, read before parsing (released configs are a few KiB): the
# records' own default bound (--max-record-bytes).
MAX_CONFIG_BYTES = 8 << 20

# transformers' objects, loaded from the model directory: duck-typed here.
Processor = Any  # transformers' ProcessorMixin (AutoProcessor's class for the model_type)
Tokenizer = Any  # transformers' PreTrainedTokenizerBase, the processor's `tokenizer`


def _families() -> dict[str, str]:
    """model_type → the family whose placeholder layout and grid rule apply (docs/plan.md):
    mmsp's C++ registry as data (python/mmsp/families.json, written by `mmsp families
    --json`), read here because `mmsp prepare` runs without the extension."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "families.json")
    with open(path, encoding="utf-8") as f:
        return {model_type: entry["family"] for model_type, entry in json.load(f)["model_types"].items()}


FAMILIES = _families()


@dataclass
class Model:
    folder: str
    model_type: str
    family: str
    config: dict[str, Any]
    processor: Processor
    videos: bool  # whether the processor can process videos (transformers' needs torchvision)
    vocab_size: int
    image_token_id: int
    video_token_id: int = -1
    vision_start_id: int = -1  # Qwen: the tokens around a block of placeholders
    vision_end_id: int = -1
    side: int = 0  # LLaVA / InternVL: S / p, patches per side of an image or tile
    tokens_per_image: int = 0  # LLaVA: placeholders per image
    tokens_per_tile: int = 0  # InternVL: placeholders per tile

    @property
    def tokenizer(self) -> Tokenizer:
        return self.processor.tokenizer


def load(folder: str) -> Model:
    config_path = os.path.join(folder, "config.json")
    if not os.path.isdir(folder):
        raise PrepareError(f'--model "{folder}" is not a folder')
    config = read_json_file(config_path, "a config.json", MAX_CONFIG_BYTES)
    for key in ("text_config", "vision_config"):
        if config.get(key) is not None and not isinstance(config[key], dict):
            raise PrepareError(f"{config_path}: {key} must be an object, not {type(config[key]).__name__}")
    model_type = config.get("model_type")
    if model_type not in FAMILIES:
        raise PrepareError(f"{config_path}: model_type {json.dumps(model_type)} is not one mmsp trains "
                           f"(supported: {', '.join(FAMILIES)})")
    processor, videos = _load_processor(folder, model_type)
    text = config.get("text_config") or {}
    vocab = config.get("vocab_size", text.get("vocab_size"))
    if not isinstance(vocab, int):
        raise PrepareError(f"{config_path}: no vocab_size (top level or text_config)")
    tokens = len(processor.tokenizer)
    if tokens > vocab:
        raise PrepareError(f"the tokenizer in {folder} has {tokens} tokens but {config_path} says vocab_size "
                           f"{vocab}: they are not the same model")
    model = Model(folder, model_type, FAMILIES[model_type], config, processor, videos, vocab,
                  image_token_id=_config_id(config, config_path, "image_token_id", "image_token_index"))
    _check_token(model, "image", model.image_token_id, processor.image_token_id)
    if model.family == "qwen_vl":
        model.video_token_id = _config_id(config, config_path, "video_token_id")
        _check_token(model, "video", model.video_token_id, processor.video_token_id)
        model.vision_start_id = _config_id(config, config_path, "vision_start_token_id")
        model.vision_end_id = _config_id(config, config_path, "vision_end_token_id")
    elif model.family == "llava":
        model.side = _side(config, config_path)
        strategy = config.get("vision_feature_select_strategy", "default")
        # "full" keeps CLIP's class token: one more placeholder per image.
        model.tokens_per_image = model.side ** 2 + (1 if strategy == "full" else 0)
    else:
        model.side = _side(config, config_path)
        ratio = config.get("downsample_ratio", 0.5)
        model.tokens_per_tile = int(round((model.side * ratio) ** 2))
        if processor.image_seq_length != model.tokens_per_tile:
            raise PrepareError(
                f"the processor in {folder} writes image_seq_length {processor.image_seq_length} placeholders per "
                f"tile but {config_path} makes {model.tokens_per_tile} ((image_size / patch_size * "
                f"downsample_ratio)^2 with image_size / patch_size {model.side} and downsample_ratio {ratio})")
    return model


def _load_processor(folder: str, model_type: str) -> tuple[Processor, bool]:
    import transformers
    from transformers.utils import is_torchvision_available

    try:
        if is_torchvision_available():
            processor = transformers.AutoProcessor.from_pretrained(folder, local_files_only=True)
            return processor, getattr(processor, "video_processor", None) is not None
        cls = _image_only(_processor_class(folder, model_type))
        return cls.from_pretrained(folder, local_files_only=True), "video_processor" in cls.get_attributes()
    except PrepareError:
        raise
    except Exception as e:  # transformers raises many kinds for a broken directory
        raise PrepareError(f'cannot load the processor of --model "{folder}": {type(e).__name__}: {e}') from None


def _processor_class(folder: str, model_type: str) -> type[Processor]:
    import transformers
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    name = None
    path = os.path.join(folder, "processor_config.json")
    if os.path.exists(path):
        name = read_json_file(path, "a processor_config.json", MAX_CONFIG_BYTES).get("processor_class")
    name = name or PROCESSOR_MAPPING_NAMES.get(model_type)
    cls = getattr(transformers, name, None) if name else None
    if cls is None:
        raise PrepareError(f'--model "{folder}": transformers {transformers.__version__} has no processor class '
                           f"{json.dumps(name)} for model_type {model_type}")
    return cls


def _image_only(cls: type[Processor]) -> type[Processor]:
    """transformers' video processors need torchvision, and the Qwen and InternVL processors refuse
    to be built without one. Without torchvision, the same class minus its video processor
    (images and text go through the class's own code; a video is refused per sample)."""
    if "video_processor" not in cls.get_attributes():
        return cls

    def get_attributes(klass: type[Processor]) -> list[str]:
        return [a for a in cls.get_attributes() if a != "video_processor"]

    return type(cls.__name__, (cls,), {"get_attributes": classmethod(get_attributes), "__module__": cls.__module__})


def _config_id(config: dict[str, Any], path: str, *names: str) -> int:
    for holder in (config, config.get("text_config") or {}):
        for name in names:
            if isinstance(holder.get(name), int):
                return holder[name]
    raise PrepareError(f"{path}: no {' or '.join(names)}")


def _check_token(model: Model, kind: str, config_id: int, processor_id: int) -> None:
    if config_id != processor_id:
        token = model.tokenizer.convert_ids_to_tokens(processor_id)
        raise PrepareError(f"{model.folder}: config.json's {kind} token id is {config_id} but the processor's {kind} "
                           f"token {token} is id {processor_id}: they are not the same model")


def _side(config: dict[str, Any], path: str) -> int:
    vision = config.get("vision_config") or {}
    size, patch = vision.get("image_size"), vision.get("patch_size")
    size = size[0] if isinstance(size, list) else size
    patch = patch[0] if isinstance(patch, list) else patch
    if not isinstance(size, int) or not isinstance(patch, int) or patch <= 0 or size % patch:
        raise PrepareError(f"{path}: vision_config image_size {json.dumps(size)} must be a multiple of "
                           f"patch_size {json.dumps(patch)}")
    return size // patch
