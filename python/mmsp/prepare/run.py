"""The whole job: every record of the input through the model's processor into the output.

`prepare(options, report)` returns a `Summary`, or raises `PrepareError` (with `FILE:LINE: ` in
front when a record was bad and `--skip-bad` was not given; no output is left then).
"""
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional, Union

from . import conversation, formats, grids, loss_mask, overflow, pairs, reader, reasoning, video_file, writer
from . import model as model_dir
from .errors import BadSample, PrepareError
from .train_bounds import INT32_MAX, MAX_IMAGE_PIXELS, MAX_IMAGE_PIXELS_BOUND, MAX_SECONDS_PER_GRID

# A record's bytes at most (--max-record-bytes): about 2 M tokens of text. prepare holds a record
# whole while the template renders it and the tokenizer cuts it, at ~180 times its size (measured:
# a text record of 8 MiB peaks at 2.4 GB, 16 MiB at 3.7 GB, with --max-length 1000 --overflow
# truncate; one of 100 MB passed 16 GB before this bound), so this is the memory bound.
MAX_RECORD_BYTES = 8 << 20

# Frame folders were taken at --video-fps, else at this rate (Qwen's released sampling rate).
FOLDER_FPS = 2.0


@dataclass
class Options:
    model: str
    input: str
    output: Optional[str] = None  # default: beside the input, <name>.prepared.jsonl
    max_length: Optional[int] = None
    overflow: str = "refuse"
    skip_bad: bool = False
    format: str = "auto"
    image_root: Optional[str] = None  # default: the input's folder
    video_fps: Optional[float] = None  # frame folders' rate (default FOLDER_FPS) and video files' sampling rate
    video_num_frames: Optional[int] = None  # video files: the video processor config's, unless given
    video_min_frames: Optional[int] = None
    video_max_frames: Optional[int] = None
    video_sample_frames: Optional[bool] = None
    max_record_bytes: int = MAX_RECORD_BYTES
    max_image_pixels: int = MAX_IMAGE_PIXELS
    enable_thinking: Optional[bool] = None  # None: the chat template's own default
    empty_think: str = "mask"
    video_wrapper: Optional[str] = None  # Qwen3-VL / Qwen3.5: the template's pair around a video's blocks (keep)


@dataclass
class Summary:
    output: str
    samples: int = 0
    pairs: int = 0  # of the samples, preference pairs (a line holding two sides)
    tokens: int = 0
    targets: int = 0
    skipped: list[str] = field(default_factory=list)  # the messages of the skipped records


def default_output(input_path: str) -> str:
    stem = os.path.basename(input_path)
    for suffix in (".jsonl", ".json"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    return os.path.join(os.path.dirname(os.path.abspath(input_path)), stem + ".prepared.jsonl")


def check(options: Options) -> None:
    if options.format not in formats.FORMATS:
        raise PrepareError(f"--format {options.format} is not one of {', '.join(formats.FORMATS)}")
    if options.overflow not in overflow.OVERFLOW:
        raise PrepareError(f"--overflow {options.overflow} is not one of {', '.join(overflow.OVERFLOW)}")
    if options.max_length is not None and options.max_length < 1:
        raise PrepareError(f"--max-length {options.max_length} must be at least 1")
    video_file.check(sampling(options))
    if options.video_wrapper not in (None,) + conversation.VIDEO_WRAPPER:
        raise PrepareError(f"--video-wrapper {options.video_wrapper} is not one of "
                           f"{', '.join(conversation.VIDEO_WRAPPER)}")
    if options.empty_think not in reasoning.EMPTY_THINK:
        raise PrepareError(f"--empty-think {options.empty_think} is not one of {', '.join(reasoning.EMPTY_THINK)}")
    if options.max_record_bytes < 1:
        raise PrepareError(f"--max-record-bytes {options.max_record_bytes} must be at least 1")
    if not 1 <= options.max_image_pixels <= MAX_IMAGE_PIXELS_BOUND:
        raise PrepareError(f"--max-image-pixels {options.max_image_pixels} must be in [1, {MAX_IMAGE_PIXELS_BOUND}] "
                           "(width x height of one image; mmsp train's range)")
    if not os.path.isfile(options.input):
        raise PrepareError(f'--input "{options.input}" ' + ("is not a file" if os.path.exists(options.input)
                                                            else "does not exist"))
    options.output = options.output or default_output(options.input)
    if os.path.abspath(options.output) == os.path.abspath(options.input):
        raise PrepareError(f'--output "{options.output}" is the input file')
    folder = os.path.dirname(os.path.abspath(options.output))
    if os.path.isdir(options.output):
        raise PrepareError(f'--output "{options.output}" is a folder')
    if not os.path.isdir(folder):
        raise PrepareError(f'--output "{options.output}": its folder "{folder}" does not exist')
    if options.image_root is not None and not os.path.isdir(options.image_root):
        raise PrepareError(f'--image-root "{options.image_root}" is not a folder')


def sampling(options: Options) -> video_file.Sampling:
    return video_file.Sampling(fps=options.video_fps, num_frames=options.video_num_frames,
                               min_frames=options.video_min_frames, max_frames=options.video_max_frames,
                               sample_frames=options.video_sample_frames)


def prepare(options: Options, report: Callable[[str], None]) -> Summary:
    """`report(message)` is told each skipped record as it is skipped."""
    check(options)
    model = model_dir.load(options.model)
    video_file.configure(model, sampling(options))
    reasoning.check_template(model.processor, options.enable_thinking)
    conversation.check_video_wrapper(model, options.video_wrapper)
    root = os.path.abspath(options.image_root or os.path.dirname(os.path.abspath(options.input)))
    # The chat template's assistant spans, made at the first conversation.
    spans: Optional[loss_mask.AssistantSpans] = None
    assert options.output is not None  # check() set it
    try:
        output = writer.Output(options.output)
    except OSError as e:
        raise PrepareError(f'cannot write beside --output "{options.output}": {e.strerror}') from None
    with output as out:
        summary = Summary(out.path)
        for line, record in reader.read_records(options.input, options.max_record_bytes):
            try:
                if isinstance(record, BadSample):
                    raise record
                sample = formats.parse(record, options.format)
                _check_kind(out, sample)
                if spans is None and (isinstance(sample, formats.Chat) or isinstance(sample, formats.Preference)
                                      and isinstance(sample.prompt, formats.Chat)):
                    spans = loss_mask.AssistantSpans(
                        model.processor, reasoning.template_kwargs(options.enable_thinking), options.empty_think)
                if isinstance(sample, formats.Preference):
                    out.write(_pair(out, model, sample, spans, root, options))
                else:
                    out.write(_row(out, model, sample, spans, root, options))
            except BadSample as e:
                message = f"{options.input}:{line}: {e}"
                if not options.skip_bad:
                    raise PrepareError(message) from None
                summary.skipped.append(message)
                report(message)
        if out.samples == 0:
            raise PrepareError(f"{options.input}: no sample to write" +
                               (f" ({len(summary.skipped)} records skipped)" if summary.skipped else ""))
        summary.samples, summary.pairs = out.samples, out.pairs
        summary.tokens, summary.targets = out.tokens, out.targets
        out.commit()
    return summary


def _check_kind(out: writer.Output, sample: Union[formats.Chat, formats.Text, formats.Preference]) -> None:
    """One output holds pairs (mmsp train --objective dpo) or samples, never both: the first line
    written decides."""
    if out.samples == 0:
        return
    pair = isinstance(sample, formats.Preference)
    if pair != bool(out.pairs):
        raise BadSample(f"a {'preference' if pair else 'conversation or text'} record in a file whose records "
                        f"before it are {'conversations or text' if pair else 'preference pairs'}: one output holds "
                        "pairs (for --objective dpo) or samples, not both")


def _pair(out: writer.Output, model: model_dir.Model, pref: formats.Preference,
          spans: Optional[loss_mask.AssistantSpans], root: str, options: Options) -> writer.Row:
    """A preference record → one pair line: {"chosen": LINE, "rejected": LINE} (pairs.py)."""
    pair = pairs.encode(model, pref, spans, root, options.max_image_pixels,
                        reasoning.template_kwargs(options.enable_thinking))
    line: writer.Row = {}
    for key, side in (("chosen", pair.chosen), ("rejected", pair.rejected)):
        try:
            if not any(side.loss_mask):
                raise BadSample("no target token: the completion adds no token to the prompt's")
            ids = side.input_ids
            if ids and max(ids) >= model.vocab_size:
                raise BadSample(f"token id {max(ids)} is outside config.json's vocabulary 0..{model.vocab_size - 1}")
            ids, mask, blocks = overflow.fit(ids, side.loss_mask, side.blocks, options.max_length, options.overflow)
            line[key] = writer.row(out, model, ids, mask, blocks, pair.images, [], side.enc)
            _check_train_bounds(model, line[key])
        except BadSample as e:
            raise BadSample(f'"{key}": {e}') from None
    return line


def _row(out: writer.Output, model: model_dir.Model, sample: Union[formats.Chat, formats.Text],
         spans: Optional[loss_mask.AssistantSpans], root: str, options: Options) -> writer.Row:
    blocks: list[grids.Block]
    images: list[str]
    videos: list[conversation.Video]
    enc: Optional[conversation.Encoded]
    if isinstance(sample, formats.Text):
        ids = conversation.encode_text(model, sample.text)
        mask, blocks, images, videos, enc = [1] * len(ids), [], [], [], None
    else:
        assert spans is not None  # prepare made them for the first conversation
        reasoning.check_rendered(sample.messages, spans.template)
        messages, images, videos = conversation.hf_messages(sample, root, model, options.max_image_pixels)
        spans.check_special_tokens(messages)  # before the processor reads them as control tokens
        enc = conversation.encode(model, messages, videos, options.video_fps or FOLDER_FPS,
                                  reasoning.template_kwargs(options.enable_thinking),
                                  keep_video_wrapper=options.video_wrapper != "drop")
        mask = loss_mask.token_mask(spans.spans(messages, enc.prompt), enc.offsets, enc.replacements, enc.prompt)
        if not any(mask):
            raise BadSample("no target token: the assistant turns are empty")
        blocks = grids.vision_blocks(model, enc)
        ids = enc.input_ids
    if ids and max(ids) >= model.vocab_size:
        raise BadSample(f"token id {max(ids)} is outside config.json's vocabulary 0..{model.vocab_size - 1}")
    ids, mask, blocks = overflow.fit(ids, mask, blocks, options.max_length, options.overflow)
    line = writer.row(out, model, ids, mask, blocks, images, videos, enc)
    _check_train_bounds(model, line)
    return line


def _check_train_bounds(model: model_dir.Model, line: writer.Row) -> None:
    """What mmsp train refuses in a line beyond the checks made on the way here (vocabulary, vision
    blocks, image files), with its numbers (train_bounds.py names the C++ of each)."""
    if len(line["input_ids"]) > INT32_MAX:
        raise BadSample(f"{len(line['input_ids'])} tokens is beyond int32 ({INT32_MAX}) that mmsp's attention "
                        "kernel indexes with")
    merge = model.config.get("vision_config", {}).get("spatial_merge_size", 1) if model.family == "qwen_vl" else 1
    for key in ("image_grid_thw", "video_grid_thw"):
        for k, (t, h, w) in enumerate(line.get(key, [])):
            where = f"{key}[{k}] = [{t}, {h}, {w}]"
            if min(t, h, w) < 1 or h % merge or w % merge:
                raise BadSample(f"{where}: t, h, w must be >= 1 and h, w divisible by spatial_merge_size {merge}")
            if t * h * w > INT32_MAX:
                raise BadSample(f"{where} has {t * h * w} patches; mmsp's vision encoder indexes an item's patches "
                                f"with int32, so an item holds at most {INT32_MAX}")
    for k, seconds in enumerate(line.get("second_per_grid_ts", [])):
        if not 0 <= seconds <= MAX_SECONDS_PER_GRID:
            raise BadSample(f"second_per_grid_ts[{k}] is {seconds}, outside [0, {MAX_SECONDS_PER_GRID:g}] seconds that "
                            "mmsp train reads (it scales video positions): is the video's frame rate or --video-fps too low?")
