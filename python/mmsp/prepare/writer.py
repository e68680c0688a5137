"""The output `.jsonl` (docs/data.md's format), written whole or not at all.

Lines go to a temporary file beside the output, renamed over it only when every record went
through: a failure (a bad line without `--skip-bad`, an interrupt) leaves no output file, and
an existing one untouched.

Media paths are written relative to the output's folder when the file is inside it (the
dataset moves with its folder), absolute otherwise; mmsp resolves relative paths against the
`.jsonl`'s folder.
"""
import json
import os
import signal
import tempfile
from types import TracebackType
from typing import Any, Literal, Optional, Self, Union

from .conversation import Encoded, Video
from .grids import Block
from .model import Model

# One output line: a JSON object (docs/data.md).
Row = dict[str, Any]

_temporaries: set[str] = set()  # the temporary files being written, for remove_temporaries
_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


def remove_temporaries() -> None:
    """Deletes every temporary file being written (a signal handler's first act)."""
    for path in list(_temporaries):
        try:
            os.unlink(path)
        except OSError:
            pass
        _temporaries.discard(path)


class Output:
    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        self.folder = os.path.dirname(self.path)
        # Signals wait while the file is made and listed: a handler always finds it to remove.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        try:
            fd, self.temporary = tempfile.mkstemp(dir=self.folder, prefix=f".{os.path.basename(path)}.",
                                                  suffix=".partial")
            _temporaries.add(self.temporary)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(self.temporary, 0o666 & ~umask)  # mkstemp's 0600 would stay on the output
        self.file = os.fdopen(fd, "w", encoding="utf-8")
        self.samples = 0
        self.pairs = 0
        self.tokens = 0
        self.targets = 0

    def path_for(self, path: str) -> str:
        relative = os.path.relpath(path, self.folder)
        return path if relative == os.pardir or relative.startswith(os.pardir + os.sep) else relative

    def write(self, row: Row) -> None:
        self.file.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")))
        self.file.write("\n")
        self.samples += 1
        sides = [row["chosen"], row["rejected"]] if "chosen" in row else [row]
        self.pairs += len(sides) == 2
        for side in sides:
            self.tokens += len(side["input_ids"])
            self.targets += sum(side["loss_mask"])

    def commit(self) -> None:
        self.file.close()
        os.replace(self.temporary, self.path)
        _temporaries.discard(self.temporary)

    def abort(self) -> None:
        self.file.close()
        if os.path.exists(self.temporary):
            os.unlink(self.temporary)
        _temporaries.discard(self.temporary)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: Optional[type[BaseException]], value: Optional[BaseException],
                 traceback: Optional[TracebackType]) -> Literal[False]:
        if kind is not None:
            self.abort()
        return False


def row(out: Output, model: Model, ids: list[int], mask: list[int], blocks: list[Block], images: list[str],
        videos: list[Video], enc: Optional[Encoded]) -> Row:
    """One output line: tokens, targets, and the items whose blocks are still in the tokens."""
    line: Row = {"input_ids": ids, "loss_mask": mask}
    kept = [b for b in blocks if b.kind == "image"]
    if kept:
        line["images"] = [{"path": out.path_for(images[b.index])} for b in kept]
        line["image_grid_thw"] = [b.grid for b in kept]
    kept = [b for b in blocks if b.kind == "video"]
    if kept:
        line["videos"] = [_video(out, videos[b.index]) for b in kept]
        line["video_grid_thw"] = [b.grid for b in kept]
        if model.model_type == "qwen2_5_vl" and enc is not None and enc.second_per_grid_ts:  # (videos: enc given)
            line["second_per_grid_ts"] = [float(enc.second_per_grid_ts[b.index]) for b in kept]
    return line


def _video(out: Output, video: Video) -> dict[str, Union[str, list[str], list[int]]]:
    """A frame folder or list: its frame files; a video file: its path and the frames sampled
    from it, which training decodes (docs/data.md)."""
    if video.file is None:
        return {"frames": [out.path_for(f) for f in video.frames]}
    return {"path": out.path_for(video.file.path), "frame_indices": list(video.file.frame_indices)}
