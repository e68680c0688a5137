"""Video files (.mp4 and whatever else FFmpeg reads): opened, sampled and decoded the way
transformers' video processors do it, so that the frames `mmsp prepare` counts are the frames
training decodes.

transformers 5.17 reads a video file with torchcodec only (`BaseVideoProcessor.fetch_videos` →
`read_video_torchcodec`): a `VideoDecoder` in seek mode "exact", whose metadata (frame count,
average fps, duration, size) go to the video processor's own `sample_frames` when
`do_sample_frames` is on, or to `default_sample_indices_fn` (every frame) when it is off, and
then `get_frames_at(indices)`. The same calls are made here with the same arguments, and the
indices go into the output line (`{"path", "frame_indices"}`, docs/data.md): training decodes
exactly those frames and never decides again.

Sampling is the model directory's video processor config (`fps`, `num_frames`, `min_frames`,
`max_frames`, `do_sample_frames`), which the `--video-*` flags override by setting the same
attributes on the loaded processor, as if the config said so.
"""
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Optional

from .errors import BadSample, PrepareError
from .model import Model, Processor
from .train_bounds import INT32_MAX

if TYPE_CHECKING:  # imported where a video is decoded
    import torch
    from torchcodec.decoders import VideoDecoder


@dataclass
class Sampling:
    """The `--video-*` flags; None: the video processor config's value."""
    fps: Optional[float] = None  # also the rate of frame folders (default 2, run.py)
    num_frames: Optional[int] = None
    min_frames: Optional[int] = None
    max_frames: Optional[int] = None
    sample_frames: Optional[bool] = None  # do_sample_frames


@dataclass
class VideoFile:
    path: str  # absolute
    frame_indices: list[int]  # into the decoded stream, in order: what get_frames_at was given
    frames: "torch.Tensor"  # uint8 [T, C, H, W], the decoded frames at those indices
    metadata: dict[str, Any]  # transformers' VideoMetadata fields, frames_indices included


def check(sampling: Sampling) -> None:
    """The flags on their own (before a model is loaded)."""
    if sampling.fps is not None and not (0 < sampling.fps < math.inf):
        raise PrepareError(f"--video-fps {sampling.fps} must be a finite number above 0")
    for flag, value in (("--video-num-frames", sampling.num_frames), ("--video-min-frames", sampling.min_frames),
                        ("--video-max-frames", sampling.max_frames)):
        if value is not None and value < 1:
            raise PrepareError(f"{flag} {value} must be at least 1")
        if value is not None and value > INT32_MAX:
            raise PrepareError(f"{flag} {value} is more frames than one video of mmsp train holds: at most "
                               f"{INT32_MAX} (an item's patches are int32-indexed, and each frame is a patch or more)")
    if sampling.fps is not None and sampling.num_frames is not None:
        raise PrepareError(f"--video-fps {sampling.fps:g} and --video-num-frames {sampling.num_frames} are exclusive "
                           "(transformers samples by one or the other): give one")
    if sampling.min_frames is not None and sampling.max_frames is not None \
            and sampling.min_frames > sampling.max_frames:
        raise PrepareError(f"--video-min-frames {sampling.min_frames} is above --video-max-frames {sampling.max_frames}")
    if sampling.num_frames is not None and sampling.max_frames is not None \
            and sampling.num_frames > sampling.max_frames:
        raise PrepareError(f"--video-num-frames {sampling.num_frames} is above --video-max-frames "
                           f"{sampling.max_frames}: a video is sampled to at most max_frames frames (Qwen3-VL's sampler takes num_frames as "
                           "given, repeating frames, and holds them all in memory)")
    if sampling.sample_frames is False and sampling.num_frames is not None:
        raise PrepareError(f"--video-num-frames {sampling.num_frames} samples frames but --video-sample-frames off "
                           "decodes every frame")


def configure(model: Model, sampling: Sampling) -> None:
    """Sets the flags on the loaded video processor (the attributes transformers reads as the
    config's). --video-fps or --video-num-frames turn sampling on, and each clears the other
    (transformers refuses both); --video-min-frames / --video-max-frames need sampling on."""
    processor = getattr(model.processor, "video_processor", None)
    if processor is None:
        return
    if sampling.fps is not None and sampling.sample_frames is not False:
        processor.fps, processor.num_frames, processor.do_sample_frames = sampling.fps, None, True
    if sampling.num_frames is not None:
        processor.num_frames, processor.fps, processor.do_sample_frames = sampling.num_frames, None, True
    for name in ("min_frames", "max_frames"):
        if getattr(sampling, name) is not None:
            setattr(processor, name, getattr(sampling, name))
    if sampling.sample_frames is not None:
        processor.do_sample_frames = sampling.sample_frames
    bounds = [f for f, v in (("--video-min-frames", sampling.min_frames), ("--video-max-frames", sampling.max_frames))
              if v is not None]
    if bounds and not processor.do_sample_frames:
        raise PrepareError(f"{' and '.join(bounds)} bound the frames sampled, but the video processor of --model "
                           f'"{model.folder}" does not sample (do_sample_frames false): add --video-fps, '
                           "--video-num-frames or --video-sample-frames on")
    _check_frame_bound(model, sampling)


def _check_frame_bound(model: Model, sampling: Sampling) -> None:
    """The frames a video is sampled to, num_frames, at most max_frames, whichever gave them (a
    flag or the video processor config): before any record, so that no video is sampled to an
    unbounded count (Qwen3-VL's sampler makes num_frames indices whatever the file holds)."""
    kwargs = _sampling_kwargs(model.processor)
    num, most = kwargs.get("num_frames"), kwargs.get("max_frames")
    if not kwargs.get("do_sample_frames") or num is None:
        return
    config = f'the video processor config of --model "{model.folder}"'
    named = f"--video-num-frames {num}" if sampling.num_frames is not None else f"num_frames {num} in {config}"
    if not isinstance(num, int) or isinstance(num, bool) or not 1 <= num <= INT32_MAX:
        raise PrepareError(f"{named} must be an integer in [1, {INT32_MAX}]")
    if most is None:
        raise PrepareError(f"{named}: {config} sets no max_frames, which bounds the frames a video is sampled to; "
                           "give --video-max-frames")
    if isinstance(most, int) and num > most:
        bound = f"--video-max-frames {most}" if sampling.max_frames is not None else f"max_frames {most} in {config}"
        raise PrepareError(f"{named} is above {bound}: a video is sampled to at most max_frames frames (raise "
                           "--video-max-frames to sample more)")


def load(path: str, what: str, model: Model, max_pixels: int) -> VideoFile:
    """Opens, samples and decodes one video file as transformers' processor would; a file that cannot
    give every sampled frame is a bad sample, named with its reason."""
    if not os.path.isfile(path):
        raise BadSample(f'{what} file "{path}" does not exist' if not os.path.exists(path)
                        else f'{what} "{path}" is not a file')
    try:
        from torchcodec.decoders import VideoDecoder
    except ImportError as e:  # torchcodec, or FFmpeg's libraries it loads (the Makefile's DEB_PACKAGES)
        raise PrepareError(f"video files need torchcodec and FFmpeg's shared libraries "
                           f"(requirements/hf.txt, docs/building.md): {_first_line(e)}") from None
    from transformers.video_utils import VideoMetadata

    try:
        # read_video_torchcodec's decoder: "exact" seeks count the frames from the file's packets
        decoder = VideoDecoder(path, seek_mode="exact", num_ffmpeg_threads=0, device="cpu")
    except Exception as e:  # torchcodec raises RuntimeError / ValueError with FFmpeg's words
        raise BadSample(f'{what} file "{path}" {_why_not_open(VideoDecoder, path, e)}') from None
    m = decoder.metadata
    if not m.num_frames:
        raise BadSample(f'{what} file "{path}" holds no video frame')
    if not m.width or not m.height or not m.average_fps:
        raise BadSample(f'{what} file "{path}" has no frame size or frame rate in its stream '
                        f"({m.width} x {m.height}, {m.average_fps} fps)")
    if m.width * m.height > max_pixels:
        raise BadSample(f'{what} file "{path}" has frames of {m.width} x {m.height} = {m.width * m.height} pixels, '
                        f"more than --max-image-pixels {max_pixels}; shrink it or raise the limit (mmsp train needs "
                        "the same --max-image-pixels)")
    if m.rotation not in (None, 0, 0.0):
        raise BadSample(f'{what} file "{path}" asks to be shown rotated by {m.rotation:g} degrees, which mmsp\'s '
                        "decoder does not do: rotate the pixels in the file")
    metadata = VideoMetadata(total_num_frames=m.num_frames, fps=m.average_fps, duration=m.duration_seconds,
                             video_backend="torchcodec", height=m.height, width=m.width)
    try:
        indices = _sample_indices_fn(model.processor)(metadata=metadata)
    except ValueError as e:  # "Video can't be sampled. The inferred num_frames=..."
        raise BadSample(f'{what} file "{path}" ({m.num_frames} frames at {m.average_fps:g} fps): '
                        f"the video processor's sampling refused it: {_first_line(e)}") from None
    indices = [int(i) for i in indices]
    if not indices:
        raise BadSample(f'{what} file "{path}" ({m.num_frames} frames at {m.average_fps:g} fps): no frame sampled')
    try:
        frames = decoder.get_frames_at(indices=indices).data.contiguous()
    except Exception as e:  # a truncated or corrupt stream: the frame is counted but not there
        raise BadSample(f'{what} file "{path}" cannot be decoded at frames {_span(indices)} '
                        f"({m.num_frames} counted): {_first_line(e)}") from None
    metadata.frames_indices = indices
    return VideoFile(path, indices, frames, {k: metadata[k] for k in metadata})


def _sampling_kwargs(processor: Processor) -> dict[str, Any]:
    """The processor's merged video kwargs (defaults from the video processor's attributes): what
    transformers' `preprocess` samples with."""
    video = processor.video_processor
    kwargs = dict(processor._merge_kwargs(processor.valid_processor_kwargs,
                                          tokenizer_init_kwargs=processor.tokenizer.init_kwargs)["videos_kwargs"])
    for name in video.valid_kwargs.__annotations__:
        kwargs.setdefault(name, getattr(video, name, None))
    for name in ("input_data_format", "device", "video_metadata", "return_tensors"):
        kwargs.pop(name, None)
    return kwargs


def _sample_indices_fn(processor: Processor) -> Callable[..., Any]:
    """The function transformers' `preprocess` would hand `fetch_videos`: the video processor's
    `sample_frames` with the processor's merged video kwargs when it samples, else
    `default_sample_indices_fn` with nothing (every frame)."""
    from transformers.video_utils import default_sample_indices_fn

    kwargs = _sampling_kwargs(processor)
    if not kwargs.pop("do_sample_frames"):
        return default_sample_indices_fn
    return partial(processor.video_processor.sample_frames, **kwargs)


def _why_not_open(VideoDecoder: "type[VideoDecoder]", path: str, error: Exception) -> str:
    """Why the decoder refused a file, in words: no video stream (an audio file, a video of zero
    frames: torchcodec's encoder writes those without one), or FFmpeg's reason (not a video,
    truncated before its index, a codec this FFmpeg lacks)."""
    try:  # the header alone: tells a file without a video stream from a broken one
        header = VideoDecoder(path, seek_mode="approximate", num_ffmpeg_threads=1, device="cpu").metadata
        if not header.num_frames:
            return "holds no video frame"
    except Exception as probe:
        if "video stream" in str(probe):
            return "holds no video stream (no frame to decode)"
    return f"cannot be read as a video: {_first_line(error)}"


def _span(indices: list[int]) -> str:
    return f"{indices[0]}..{indices[-1]}" if len(indices) > 1 else str(indices[0])


def _first_line(error: BaseException) -> str:
    """torchcodec's message without its source location ("SingleStreamDecoder, /.../x.cpp:41, ")."""
    text = str(error).strip().splitlines()
    return re.sub(r"^\w+, \S+\.cpp:\d+, ", "", text[0]) if text else type(error).__name__
