"""A preference record (`formats.Preference`) → the token ids and targets of its two sides, as
TRL 1.16's DPOTrainer feeds them to the model (docs/prepare.md, "Preference pairs (DPO)").

TRL tokenizes preference data in one of two places, and which one depends on the dataset:

- a vision dataset (its records have "image" / "images"): `DataCollatorForVisionPreference`.
  The chat template renders the prompt with the generation prompt and the prompt followed by
  each completion (trl.data_utils.apply_chat_template); the prompt's text is the characters the
  three renderings share, each completion's text the rest of its rendering. The processor
  tokenizes the prompt with the images, and each completion alone, both with
  `add_special_tokens=False`; a side is the prompt's tokens then its completion's, the
  completion's tokens its targets;
- any other dataset: `DPOTrainer._prepare_dataset`. Conversational records: the processor's
  `apply_chat_template(tokenize=True)` of the prompt (with the generation prompt) and of the
  prompt followed by each completion (trl.data_utils._tokenize); standard (string) records: the
  processor on the prompt and on the prompt followed by each completion with the EOS token
  appended to the completion. The prompt is the tokens the three share
  (trl.data_utils.common_prefix_length); what follows in a side is its targets
  (`DataCollatorForPreference`).

Here a record with "image" / "images" (even an empty list) takes the first way, any other the
second. What TRL does after (padding, `--max-length` truncation) is mmsp's own.
"""
from dataclasses import dataclass
from typing import Any, Optional

from . import conversation, grids, reasoning
from .conversation import Encoded, HFMessage
from .errors import BadSample, PrepareError
from .formats import Chat, Message, Preference
from .loss_mask import AssistantSpans
from .model import Model


@dataclass
class Side:
    """One side of a pair: its tokens, its targets, and the prompt's vision blocks in them."""
    input_ids: list[int]
    loss_mask: list[int]
    blocks: list[grids.Block]
    enc: Optional[Encoded]


@dataclass
class Pair:
    chosen: Side
    rejected: Side
    images: list[str]  # the prompt's image files, absolute, in order (both sides hold them)


def encode(model: Model, pref: Preference, spans: Optional[AssistantSpans], root: str, max_pixels: int,
           template_kwargs: dict[str, Any]) -> Pair:
    if isinstance(pref.prompt, str):
        assert isinstance(pref.chosen, str) and isinstance(pref.rejected, str)
        return _standard(model, pref.prompt, pref.chosen, pref.rejected)
    assert spans is not None  # made for the first conversational record
    assert not isinstance(pref.chosen, str) and not isinstance(pref.rejected, str)
    reasoning.check_rendered(pref.prompt.messages + pref.chosen + pref.rejected, spans.template)
    prompt, images, videos = conversation.hf_messages(pref.prompt, root, model, max_pixels)
    assert not videos  # formats refuses them
    chosen = _hf_completion(pref.chosen, root, model, max_pixels)
    rejected = _hf_completion(pref.rejected, root, model, max_pixels)
    for key, completion in (("chosen", chosen), ("rejected", rejected)):
        try:
            spans.check_special_tokens(completion)
        except BadSample as e:
            raise BadSample(f'"{key}" {e}') from None
    if pref.vision:
        return _vision(model, prompt, chosen, rejected, images, template_kwargs)
    sides = [_apply_template(model, prompt, template_kwargs, add_generation_prompt=True),
             _apply_template(model, prompt + chosen, template_kwargs),
             _apply_template(model, prompt + rejected, template_kwargs)]
    return _by_common_prefix(model, *sides)


def _hf_completion(messages: list[Message], root: str, model: Model, max_pixels: int) -> list[HFMessage]:
    hf, _, _ = conversation.hf_messages(Chat(messages), root, model, max_pixels)
    return hf


def _vision(model: Model, prompt: list[HFMessage], chosen: list[HFMessage], rejected: list[HFMessage],
            images: list[str], template_kwargs: dict[str, Any]) -> Pair:
    """TRL's DataCollatorForVisionPreference (with trl.data_utils.apply_chat_template)."""
    prompt_text = _render(model, prompt, template_kwargs, add_generation_prompt=True)
    chosen_text = _render(model, prompt + chosen, template_kwargs)
    rejected_text = _render(model, prompt + rejected, template_kwargs)
    # The prompt is what all three renderings share (TRL: for DeepSeek-R1's generation prompt).
    prompt_text = prompt_text[:_common_prefix(prompt_text, chosen_text)]
    prompt_text = prompt_text[:_common_prefix(prompt_text, rejected_text)]
    pixels = [part["image"] for m in prompt for part in m["content"] if part["type"] == "image"]
    head = _process(model, prompt_text, pixels or None, replacements=True)
    sides = []
    for text in (chosen_text, rejected_text):
        tail = _process(model, text[len(prompt_text):], None, replacements=False)
        # The completion's characters after the prompt's (the vision blocks bisect on them).
        base = head.offsets[-1][1] if head.offsets else 0
        enc = Encoded(input_ids=head.input_ids + tail.input_ids,
                      offsets=head.offsets + [(base + a, base + b) for a, b in tail.offsets],
                      prompt=head.prompt + tail.prompt, replacements=head.replacements,
                      image_grid_thw=head.image_grid_thw, video_grid_thw=[], second_per_grid_ts=[])
        mask = [0] * len(head.input_ids) + [1] * len(tail.input_ids)
        sides.append(Side(enc.input_ids, mask, grids.vision_blocks(model, enc), enc))
    return Pair(sides[0], sides[1], images)


def _process(model: Model, text: str, images: Optional[list[Any]], replacements: bool) -> Encoded:
    """The processor's call as TRL's vision collator makes it, with each token's characters and
    (the prompt) each placeholder expansion's place."""
    kwargs: dict[str, Any] = {"add_special_tokens": False, "return_offsets_mapping": True}
    if replacements:
        kwargs["return_text_replacement_offsets"] = True
    try:
        out = model.processor(images=images, text=text, **kwargs)
    except Exception as e:  # a size the image processor refuses, ...
        raise BadSample(f"the processor refused it: {type(e).__name__}: {e}") from None
    found = out.get("text_replacement_offsets")
    if replacements and found is None:
        raise PrepareError(f"{type(model.processor).__name__} does not report where it expands placeholders "
                           "(return_text_replacement_offsets): mmsp prepare needs transformers 5.17 or newer")
    rows = conversation._rows
    return Encoded(input_ids=[int(t) for t in out["input_ids"][0]],
                   offsets=[(int(a), int(b)) for a, b in out["offset_mapping"][0]], prompt=text,
                   replacements=list(found[0]) if found is not None else [],
                   image_grid_thw=rows(out.get("image_grid_thw")), video_grid_thw=[], second_per_grid_ts=[])


def _standard(model: Model, prompt: str, chosen: str, rejected: str) -> Pair:
    """TRL's DPOTrainer._prepare_dataset on a standard (string) record: the EOS token appended to
    each completion that lacks it, then the processor on the prompt and on prompt + completion."""
    eos = model.tokenizer.eos_token
    if eos:
        chosen = chosen if chosen.endswith(eos) else chosen + eos
        rejected = rejected if rejected.endswith(eos) else rejected + eos
    return _by_common_prefix(model, *(_call(model, t) for t in (prompt, prompt + chosen, prompt + rejected)))


def _call(model: Model, text: str) -> list[int]:
    try:
        out = model.processor(text=text)
    except Exception as e:
        raise BadSample(f"the processor refused it: {type(e).__name__}: {e}") from None
    return [int(t) for t in out["input_ids"][0]]


def _by_common_prefix(model: Model, prompt: list[int], chosen: list[int], rejected: list[int]) -> Pair:
    """TRL's tokenize_fn and DataCollatorForPreference: the prompt is the tokens all three share
    (common_prefix_length); each side is prompt + completion with the completion as targets."""
    n = min(_common_prefix(prompt, chosen), _common_prefix(prompt, rejected))
    sides = []
    for ids in (chosen, rejected):
        # No image: the blocks are none, and a vision token typed in a turn's text is refused here.
        enc = Encoded(input_ids=ids, offsets=[], prompt="", replacements=[], image_grid_thw=[], video_grid_thw=[],
                      second_per_grid_ts=[])
        sides.append(Side(ids, [0] * n + [1] * (len(ids) - n), grids.vision_blocks(model, enc), None))
    return Pair(sides[0], sides[1], [])


def _render(model: Model, messages: list[HFMessage], template_kwargs: dict[str, Any],
            add_generation_prompt: bool = False) -> str:
    try:
        return str(model.processor.apply_chat_template(messages, tokenize=False,
                                                       add_generation_prompt=add_generation_prompt,
                                                       **template_kwargs))
    except Exception as e:  # the template's raise_exception
        raise BadSample(f"the chat template refused it: {type(e).__name__}: {e}") from None


def _apply_template(model: Model, messages: list[HFMessage], template_kwargs: dict[str, Any],
                    add_generation_prompt: bool = False) -> list[int]:
    """trl.data_utils._tokenize on a conversation: the processor's apply_chat_template, tokenized."""
    try:
        out = model.processor.apply_chat_template(messages, tokenize=True, return_dict=True,
                                                  add_generation_prompt=add_generation_prompt, **template_kwargs)
    except Exception as e:
        raise BadSample(f"the processor refused it: {type(e).__name__}: {e}") from None
    return [int(t) for t in out["input_ids"][0]]


def _common_prefix(a: Any, b: Any) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
