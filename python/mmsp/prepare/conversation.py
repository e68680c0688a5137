"""One sample through transformers' processor: a `Chat` (media decoded) → token ids, each token's
characters, the rendered prompt and where each vision placeholder went.

The token ids are exactly `processor.apply_chat_template(messages, tokenize=True)`'s (with
`enable_thinking=` when --enable-thinking is given): the processor renders the template, expands
every image / video placeholder to the count its image processor gives for that item's size,
and tokenizes. Only two things are asked of it on top: each token's characters
(`return_offsets_mapping`) and each expansion's place (`return_text_replacement_offsets`), which
the loss mask and the vision blocks need. With `--video-wrapper drop` one change is made to
them: a Qwen3-VL / Qwen3.5 video loses the template's `<|vision_start|>` / `<|vision_end|>`
around its timestamped blocks (`_unwrap_framed_videos` says why).
"""
import bisect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from . import media, video_file
from .errors import BadSample, PrepareError
from .formats import Chat
from .model import Model

if TYPE_CHECKING:  # imported where frames are stacked
    import torch


# --video-wrapper: keep the template's pair around a Qwen3-VL video's frame blocks, or drop it.
VIDEO_WRAPPER = ("keep", "drop")
# The model types whose processor leaves that pair (each temporal patch its own timestamped block).
WRAPPED_VIDEOS = ("qwen3_vl", "qwen3_5", "qwen3_vl_moe", "qwen3_5_moe")

# A message as transformers' processors take it: {"role", "content": [{"type", ...}], "reasoning_content"?}.
HFMessage = dict[str, Any]


def check_video_wrapper(model: Model, choice: Optional[str]) -> None:
    """--video-wrapper given for a model whose videos have no wrapper would change nothing."""
    if choice is not None and model.model_type not in WRAPPED_VIDEOS:
        raise PrepareError(f"--video-wrapper {choice}: the processor of model_type {model.model_type} writes no "
                           "<|vision_start|> / <|vision_end|> pair around a video's frame blocks (only "
                           f"{' and '.join(WRAPPED_VIDEOS)} do), so the flag would change nothing; leave it out")


@dataclass
class Encoded:
    input_ids: list[int]
    offsets: list[tuple[int, int]]  # per token: (start, end) characters of the text the processor tokenized
    prompt: str  # the chat template's output, before placeholder expansion
    replacements: list[dict[str, Any]]  # per vision item, in order: {"type", "span", "new_span", ...}
    image_grid_thw: list[list[int]]
    video_grid_thw: list[list[int]]
    second_per_grid_ts: list[float]


@dataclass
class Video:
    frames: list[str]  # frame folders and lists: the frame files; a video file: []
    file: Optional[video_file.VideoFile] = None  # a video file: its path, sampled indices, frames


def hf_messages(chat: Chat, root: str, model: Model,
                max_pixels: int) -> tuple[list[HFMessage], list[str], list[Video]]:
    """`Chat` → the messages transformers' processors take, every file decoded and checked (an
    image file, a video frame at most `max_pixels` pixels); returns them with the absolute paths
    of the images and the videos (`Video`s)."""
    images: list[str] = []
    videos: list[Video] = []
    messages: list[HFMessage] = []
    for message in chat.messages:
        content: list[dict[str, Any]] = []
        for part in message.parts:
            if part.kind == "text":
                content.append({"type": "text", "text": part.text})
            elif part.kind == "image":
                path = media.resolve(part.source, root, part.where)
                content.append({"type": "image", "image": media.load_image(path, part.where, max_pixels)})
                images.append(path)
            else:
                if model.family != "qwen_vl" or not model.videos:
                    raise BadSample(f"{part.where}: {_no_video_reason(model)}")
                _, source = media.video_source(part.source, root, part.where)
                if isinstance(source, str):  # "file": a video file's path (else "frames": its frame files)
                    loaded = video_file.load(source, part.where, model, max_pixels)
                    content.append({"type": "video", "video": loaded.frames})
                    video = Video([], loaded)
                else:
                    content.append({"type": "video", "video": _folder_video(source, part.where, max_pixels)})
                    video = Video(source)
                videos.append(video)
        messages.append({"role": message.role, "content": content})
        if message.reasoning is not None:
            messages[-1]["reasoning_content"] = message.reasoning  # the key the released templates read
    return messages, images, videos


def _folder_video(frames: list[str], where: str, max_pixels: int) -> "torch.Tensor":
    """A frame folder's (or list's) frames decoded, as one uint8 [T, C, H, W] tensor: the layout
    torchcodec gives a video file's, so that both kinds can go to the processor together."""
    import numpy as np
    import torch

    decoded = [media.load_image(f, f"{where} frame {k}", max_pixels) for k, f in enumerate(frames)]
    if len({im.size for im in decoded}) > 1:
        raise BadSample(f"{where}: its frames differ in size: "
                        f"{sorted({f'{w} x {h}' for w, h in (im.size for im in decoded)})}")
    return torch.from_numpy(np.stack([np.asarray(im.convert("RGB")) for im in decoded])).permute(0, 3, 1, 2)


def encode(model: Model, messages: list[HFMessage], videos: list[Video], video_fps: float,
           template_kwargs: Optional[dict[str, Any]] = None, keep_video_wrapper: bool = True) -> Encoded:
    """Tokenizes a conversation with the processor; `videos` (`Video`s) give the metadata;
    `template_kwargs` go to the chat template (enable_thinking); `keep_video_wrapper`: leave a
    Qwen3-VL video's wrapper as transformers wrote it."""
    template_kwargs = template_kwargs or {}
    kwargs: dict[str, Any] = {"return_offsets_mapping": True, "return_text_replacement_offsets": True}
    if videos:
        # Every video arrives decoded and sampled: a video file's frames at the indices its video
        # processor's own sampling chose (video_file.py), with the metadata transformers' decoder
        # would give it; a frame folder as the user cut it, taken at --video-fps. Qwen3-VL's
        # timestamps and Qwen2.5-VL's second_per_grid_ts come from that metadata.
        kwargs.update(do_sample_frames=False, video_metadata=[
            v.file.metadata if v.file else
            {"total_num_frames": len(v.frames), "fps": video_fps, "frames_indices": list(range(len(v.frames))),
             "duration": len(v.frames) / video_fps} for v in videos])
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
    ids, offsets = [int(t) for t in out["input_ids"][0]], [(int(a), int(b)) for a, b in out["offset_mapping"][0]]
    replacements = list(replacements[0])
    if model.family == "qwen_vl" and not keep_video_wrapper:
        _unwrap_framed_videos(model, ids, offsets, replacements)
    return Encoded(
        input_ids=ids,
        offsets=offsets,
        prompt=prompt,
        replacements=replacements,
        image_grid_thw=_rows(out.get("image_grid_thw")),
        video_grid_thw=_rows(out.get("video_grid_thw")),
        second_per_grid_ts=_rows(out.get("second_per_grid_ts")),
    )


def _unwrap_framed_videos(model: Model, ids: list[int], offsets: list[tuple[int, int]],
                          replacements: list[dict[str, Any]]) -> None:
    """Qwen3-VL / Qwen3.5: the processor expands a video into its own blocks, one per temporal
    patch, each after its timestamp (`<0.3 seconds><|vision_start|>...<|vision_end|>`), but
    transformers 5.17 replaces only the template's `<|video_pad|>`, leaving the template's
    `<|vision_start|>` / `<|vision_end|>` around them: nested blocks. Qwen's own processor (the
    one the models were released with, transformers 4.57) replaced the template's three tokens
    whole, as vLLM does and as ms-swift's template got from it: the models learnt videos without
    the pair. `--video-wrapper drop` writes that form: the template's pair around such an
    expansion is dropped here (in place). transformers 5.x's model gives the pair text
    positions, and so does mmsp's trainer (docs/prepare-videos.md), so the default keeps
    transformers' ids as they are."""
    start_token = getattr(model.processor, "vision_start_token", None)
    if not start_token:
        return
    starts = [a for a, _ in offsets]
    for r in reversed(replacements):
        if r["type"] != "video" or start_token not in r.get("replacement", ""):
            continue
        lo, hi = r["new_span"]
        first, after = bisect.bisect_left(starts, lo), bisect.bisect_left(starts, hi)
        if 0 < first and after < len(ids) and ids[first - 1] == model.vision_start_id \
                and ids[after] == model.vision_end_id:
            for i in (after, first - 1):
                del ids[i], offsets[i], starts[i]


def encode_text(model: Model, text: str) -> list[int]:
    """A plain-text sample: the tokenizer's ids (with its own special tokens, e.g. LLaVA's <s>)."""
    return [int(t) for t in model.tokenizer(text)["input_ids"]]


def _rows(value: Any) -> list[Any]:
    if value is None:
        return []
    return value.tolist() if hasattr(value, "tolist") else list(value)


def _no_video_reason(model: Model) -> str:
    if model.family != "qwen_vl":
        return f"mmsp trains videos for the Qwen families only, not {model.model_type}"
    return ("videos need transformers' video processor, which needs torchvision, and torchvision is not "
            "installed here")
