"""One sample through transformers' processor: a `Chat` (media decoded) → token ids, each token's
characters, the rendered prompt and where each vision placeholder went.

The token ids are exactly `processor.apply_chat_template(messages, tokenize=True)`'s (with
`enable_thinking=` when --enable-thinking is given): the processor renders the template, expands
every image / video placeholder to the count its image processor gives for that item's size,
and tokenizes. Only two things are asked of it on top: each token's characters
(`return_offsets_mapping`) and each expansion's place (`return_text_replacement_offsets`), which
the loss mask and the vision blocks need.
"""
from dataclasses import dataclass

from . import media
from .errors import BadSample, PrepareError


@dataclass
class Encoded:
    input_ids: list
    offsets: list  # per token: (start, end) characters of the text the processor tokenized
    prompt: str  # the chat template's output, before placeholder expansion
    replacements: list  # per vision item, in order: {"type", "span", "new_span", ...}
    image_grid_thw: list
    video_grid_thw: list
    second_per_grid_ts: list


def hf_messages(chat, root, model, max_pixels):
    """`Chat` → the messages transformers' processors take, every file decoded and checked (an
    image file at most `max_pixels` pixels); returns them with the absolute paths of the images
    and the frames of the videos."""
    images, videos, messages = [], [], []
    for message in chat.messages:
        content = []
        for part in message.parts:
            if part.kind == "text":
                content.append({"type": "text", "text": part.text})
            elif part.kind == "image":
                path = media.resolve(part.source, root, part.where)
                content.append({"type": "image", "image": media.load_image(path, part.where, max_pixels)})
                images.append(path)
            else:
                if model.family != "qwen" or not model.videos:
                    raise BadSample(f"{part.where}: {_no_video_reason(model)}")
                frames = media.video_frames(part.source, root, part.where)
                decoded = [media.load_image(f, f"{part.where} frame {k}", max_pixels) for k, f in enumerate(frames)]
                if len({im.size for im in decoded}) > 1:
                    raise BadSample(f"{part.where}: its frames differ in size: "
                                    f"{sorted({f'{w} x {h}' for w, h in (im.size for im in decoded)})}")
                content.append({"type": "video", "video": decoded})
                videos.append(frames)
        messages.append({"role": message.role, "content": content})
        if message.reasoning is not None:
            messages[-1]["reasoning_content"] = message.reasoning  # the key the released templates read
    return messages, images, videos


def encode(model, messages, videos, video_fps, template_kwargs=None):
    """Tokenizes a conversation with the processor; `videos` (frame lists) only sizes the metadata;
    `template_kwargs` go to the chat template (enable_thinking)."""
    template_kwargs = template_kwargs or {}
    kwargs = {"return_offsets_mapping": True, "return_text_replacement_offsets": True}
    if videos:
        # The frames are the video as the user cut it: no resampling, and they were taken at
        # --video-fps (Qwen3-VL's timestamps, Qwen2.5-VL's second_per_grid_ts come from it).
        kwargs.update(do_sample_frames=False, fps=video_fps, video_metadata=[
            {"total_num_frames": len(f), "fps": video_fps, "frames_indices": list(range(len(f))),
             "duration": len(f) / video_fps} for f in videos])
    try:
        prompt = model.processor.apply_chat_template(messages, tokenize=False, **template_kwargs)
        out = model.processor.apply_chat_template(messages, tokenize=True, return_dict=True,
                                                  processor_kwargs=kwargs, **template_kwargs)
    except PrepareError:
        raise
    except Exception as e:  # the template's raise_exception, a size the image processor refuses...
        raise BadSample(f"the processor refused it: {type(e).__name__}: {e}") from None
    replacements = out.get("text_replacement_offsets")
    if replacements is None:
        raise PrepareError(f"{type(model.processor).__name__} does not report where it expands placeholders "
                           "(return_text_replacement_offsets): mmsp prepare needs transformers 5.17 or newer")
    return Encoded(
        input_ids=[int(t) for t in out["input_ids"][0]],
        offsets=[(int(a), int(b)) for a, b in out["offset_mapping"][0]],
        prompt=prompt,
        replacements=list(replacements[0]),
        image_grid_thw=_rows(out.get("image_grid_thw")),
        video_grid_thw=_rows(out.get("video_grid_thw")),
        second_per_grid_ts=_rows(out.get("second_per_grid_ts")),
    )


def encode_text(model, text):
    """A plain-text sample: the tokenizer's ids (with its own special tokens, e.g. LLaVA's <s>)."""
    return [int(t) for t in model.tokenizer(text)["input_ids"]]


def _rows(value):
    if value is None:
        return []
    return value.tolist() if hasattr(value, "tolist") else list(value)


def _no_video_reason(model):
    if model.family != "qwen":
        return f"mmsp trains videos for the Qwen families only, not {model.model_type}"
    return ("videos need transformers' video processor, which needs torchvision, and torchvision is not "
            "installed here")
