"""`python -m mmsp.prepare` (and `mmsp prepare`, which runs it): flags, messages, exit codes.

Exit 0 with a one-line summary on stderr; exit 2 with `mmsp prepare: error: ...` on stderr for
any user error (a bad record: `FILE:LINE: ...`), leaving no output file. SIGTERM, SIGINT and
SIGHUP end it with 128 + the signal's number, leaving no output file either (the temporary one
is removed in the handler itself).
"""
import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType
from typing import NoReturn, Optional

from . import conversation, formats, overflow, reasoning, writer
from .errors import PrepareError
from .run import MAX_RECORD_BYTES, Options, prepare
from .train_bounds import MAX_IMAGE_PIXELS

PROG = "mmsp prepare"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise PrepareError(message)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Turn conversation data into mmsp's .jsonl with a model directory's "
                                       "own processor (docs/prepare.md).")
    p.add_argument("--model", required=True, metavar="DIR",
                   help="Hugging Face model directory: config.json, the tokenizer, chat template and processor")
    p.add_argument("--input", required=True, metavar="FILE", help="a JSON list or JSON lines of records")
    p.add_argument("--output", metavar="OUT.jsonl", help="default: beside the input, NAME.prepared.jsonl")
    p.add_argument("--max-length", type=int, metavar="N", help="the most tokens a sample may have")
    p.add_argument("--overflow", choices=overflow.OVERFLOW, default="refuse",
                   help="a sample over --max-length: refuse it (an error) or truncate it (default refuse)")
    p.add_argument("--skip-bad", action="store_true",
                   help="skip bad records, listing them on stderr, instead of stopping at the first")
    p.add_argument("--format", choices=formats.FORMATS, default="auto",
                   help="the records' format (default: told from each record's fields)")
    p.add_argument("--image-root", metavar="DIR",
                   help="relative image and video paths are under DIR (default: the input's folder)")
    p.add_argument("--video-fps", type=float, metavar="FPS",
                   help="frames per second the model sees: video files are sampled at FPS, frame folders were taken at "
                        "FPS (Qwen timestamps; default: the video processor config's for files, 2 for folders)")
    p.add_argument("--video-num-frames", type=int, metavar="N",
                   help="video files: sample N frames each instead of a rate (the config's num_frames)")
    p.add_argument("--video-min-frames", type=int, metavar="N",
                   help="video files: sample at least N frames (the config's min_frames)")
    p.add_argument("--video-max-frames", type=int, metavar="N",
                   help="video files: sample at most N frames (the config's max_frames)")
    p.add_argument("--video-sample-frames", choices=("on", "off"),
                   help="video files: sample frames (on) or decode every frame (off); default: the config's "
                        "do_sample_frames, on when --video-fps or --video-num-frames is given")
    p.add_argument("--video-wrapper", choices=conversation.VIDEO_WRAPPER,
                   help="Qwen3-VL / Qwen3.5 videos: the chat template's <|vision_start|> / <|vision_end|> that "
                        "transformers 5.x leaves around a video's timestamped frame blocks; keep: transformers 5.x's "
                        "tokens exactly (default), drop: the released processor's and vLLM's tokens; an error for "
                        "another model_type, whose videos have no such pair")
    p.add_argument("--max-record-bytes", type=int, default=MAX_RECORD_BYTES, metavar="N",
                   help="a longer record is a bad record, never read whole: the memory bound "
                        f"(default {MAX_RECORD_BYTES}: 8 MiB, which peaks at about 2.4 GB)")
    p.add_argument("--max-image-pixels", type=int, default=MAX_IMAGE_PIXELS, metavar="N",
                   help="width x height of one image file at most, from its header before decoding; mmsp train's "
                        f"flag, the same default ({MAX_IMAGE_PIXELS})")
    p.add_argument("--enable-thinking", choices=("on", "off"),
                   help="passed to the chat template as enable_thinking (default: the template's own default); "
                        "an error for a template that does not read it")
    p.add_argument("--empty-think", choices=reasoning.EMPTY_THINK, default="mask",
                   help="a turn rendered with an empty think block (no reasoning): mask leaves the block out of the "
                        "targets, train makes the model learn to close it at once (default mask)")
    return p


class Interrupted(BaseException):
    """A signal that ends the run (a BaseException: no `except Exception` on the way swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _on_signal(signum: int, frame: Optional[FrameType]) -> NoReturn:
    writer.remove_temporaries()  # now: wherever the exception lands, nothing is left behind
    raise Interrupted(signum)


def main(argv: Optional[Sequence[str]] = None) -> int:
    def report(message: str) -> None:
        print(f"{message} (skipped)", file=sys.stderr, flush=True)

    # (Handlers can be set in the main thread only: `main` called elsewhere keeps the process's own.)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = {s: signal.signal(s, _on_signal) for s in _SIGNALS} if main_thread else {}
    try:
        args = parser().parse_args(argv)
        _quiet_transformers()
        options = Options(model=args.model, input=args.input, output=args.output, max_length=args.max_length,
                          overflow=args.overflow, skip_bad=args.skip_bad, format=args.format,
                          image_root=args.image_root, video_fps=args.video_fps,
                          video_num_frames=args.video_num_frames, video_min_frames=args.video_min_frames,
                          video_max_frames=args.video_max_frames,
                          video_sample_frames=None if args.video_sample_frames is None
                          else args.video_sample_frames == "on",
                          max_record_bytes=args.max_record_bytes, max_image_pixels=args.max_image_pixels,
                          enable_thinking=None if args.enable_thinking is None else args.enable_thinking == "on",
                          empty_think=args.empty_think, video_wrapper=args.video_wrapper)
        summary = prepare(options, report)
    except PrepareError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except (Interrupted, KeyboardInterrupt) as e:
        signum = getattr(e, "signum", signal.SIGINT)
        print(f"{PROG}: interrupted by {signal.Signals(signum).name}; the output is not written", file=sys.stderr)
        return 128 + signum
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    what = _count(summary.pairs, "preference pair") if summary.pairs else _count(summary.samples, "sample")
    print(f"{PROG}: wrote {what} ({summary.tokens:,} tokens, {summary.targets:,} "
          f"targets) to {summary.output}; skipped {_count(len(summary.skipped), 'bad record')}", file=sys.stderr)
    return 0


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _quiet_transformers() -> None:
    # Its notices (the PIL fallback when torchvision is missing, ...) would drown our messages.
    from transformers.utils import logging

    logging.set_verbosity_error()
