"""The whole job: every record of the input through the model's processor into the output.

`prepare(options, report)` returns a `Summary`, or raises `PrepareError` (with `FILE:LINE: ` in
front when a record was bad and `--skip-bad` was not given; no output is left then).
"""
import os
from dataclasses import dataclass, field

from . import conversation, formats, grids, loss_mask, model as model_dir, overflow, reader, writer
from .errors import BadSample, PrepareError


@dataclass
class Options:
    model: str
    input: str
    output: str = None  # default: beside the input, <name>.prepared.jsonl
    max_length: int = None
    overflow: str = "refuse"
    skip_bad: bool = False
    format: str = "auto"
    image_root: str = None  # default: the input's folder
    video_fps: float = 2.0


@dataclass
class Summary:
    output: str
    samples: int = 0
    tokens: int = 0
    targets: int = 0
    skipped: list = field(default_factory=list)  # the messages of the skipped records


def default_output(input_path):
    stem = os.path.basename(input_path)
    for suffix in (".jsonl", ".json"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    return os.path.join(os.path.dirname(os.path.abspath(input_path)), stem + ".prepared.jsonl")


def check(options):
    if options.format not in formats.FORMATS:
        raise PrepareError(f"--format {options.format} is not one of {', '.join(formats.FORMATS)}")
    if options.overflow not in overflow.OVERFLOW:
        raise PrepareError(f"--overflow {options.overflow} is not one of {', '.join(overflow.OVERFLOW)}")
    if options.max_length is not None and options.max_length < 1:
        raise PrepareError(f"--max-length {options.max_length} must be at least 1")
    if not options.video_fps > 0:
        raise PrepareError(f"--video-fps {options.video_fps} must be above 0")
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


def prepare(options, report):
    """`report(message)` is told each skipped record as it is skipped."""
    check(options)
    model = model_dir.load(options.model)
    root = os.path.abspath(options.image_root or os.path.dirname(os.path.abspath(options.input)))
    spans = None  # the chat template's assistant spans, made at the first conversation
    try:
        output = writer.Output(options.output)
    except OSError as e:
        raise PrepareError(f'cannot write beside --output "{options.output}": {e.strerror}') from None
    with output as out:
        summary = Summary(out.path)
        for line, record in reader.read_records(options.input):
            try:
                if isinstance(record, BadSample):
                    raise record
                sample = formats.parse(record, options.format)
                if isinstance(sample, formats.Chat) and spans is None:
                    spans = loss_mask.AssistantSpans(model.processor)
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
        summary.samples, summary.tokens, summary.targets = out.samples, out.tokens, out.targets
        out.commit()
    return summary


def _row(out, model, sample, spans, root, options):
    if isinstance(sample, formats.Text):
        ids = conversation.encode_text(model, sample.text)
        mask, blocks, images, videos, enc = [1] * len(ids), [], [], [], None
    else:
        messages, images, videos = conversation.hf_messages(sample, root, model)
        enc = conversation.encode(model, messages, videos, options.video_fps)
        mask = loss_mask.token_mask(spans.spans(messages, enc.prompt), enc.offsets, enc.replacements, enc.prompt)
        if not any(mask):
            raise BadSample("no target token: the assistant turns are empty")
        blocks = grids.vision_blocks(model, enc)
        ids = enc.input_ids
    if ids and max(ids) >= model.vocab_size:
        raise BadSample(f"token id {max(ids)} is outside config.json's vocabulary 0..{model.vocab_size - 1}")
    ids, mask, blocks = overflow.fit(ids, mask, blocks, options.max_length, options.overflow)
    return writer.row(out, model, ids, mask, blocks, images, videos, enc)
