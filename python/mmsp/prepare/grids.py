"""Vision blocks: where each image's / video's placeholders are in the tokens, and its grid.

The grid is what mmsp's `.jsonl` carries per item (docs/data.md), by family:

- Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5: the processor's own `image_grid_thw` /
  `video_grid_thw` (patches, after its resize); the block holds t·h·w / merge² placeholders;
- LLaVA: `[1, S/p, S/p]` (`S`, `p`: config.json's vision image_size and patch_size); the block
  holds (S/p)² placeholders (+ 1 with the `full` feature strategy);
- InternVL: `[tiles, S/p, S/p]` with the tile count the processor cut; the block holds
  tiles · image_seq_length placeholders between `<img>` and `</img>`.

Each count is checked against the tokens, and so is every vision token outside a block (a
`<|vision_start|>` typed in a turn's text would break the trainer's parse).
"""
import bisect
from dataclasses import dataclass

from .conversation import Encoded
from .errors import BadSample
from .model import Model


@dataclass
class Block:
    kind: str  # "image" or "video"
    index: int  # among the sample's items of its kind
    start: int  # tokens [start, end): the placeholders and the tokens that frame them
    end: int
    grid: list[int]


def vision_blocks(model: Model, enc: Encoded) -> list[Block]:
    starts = [a for a, _ in enc.offsets]
    blocks: list[Block] = []
    counts = {"image": 0, "video": 0}
    for r in enc.replacements:
        kind = r["type"]
        index = counts[kind]
        counts[kind] += 1
        lo, hi = r["new_span"]
        start = bisect.bisect_left(starts, lo)
        end = bisect.bisect_left(starts, hi)
        block = Block(kind, index, start, end, _grid(model, enc, kind, index, enc.input_ids[start:end]))
        if model.family == "qwen_vl":
            # The template's <|vision_start|> / <|vision_end|> around the placeholders.
            inner = (block.start, block.end)
            if block.start > 0 and enc.input_ids[block.start - 1] == model.vision_start_id:
                block.start -= 1
            if block.end < len(enc.input_ids) and enc.input_ids[block.end] == model.vision_end_id:
                block.end += 1
            # A Qwen3-VL video's frame blocks (`<0.3 seconds><|vision_start|>...`) with the
            # template's pair kept around them (--video-wrapper keep): a wrapper the trainer reads
            # as text; the frames inside are checked as blocks.
            tokens = enc.input_ids[block.start:block.end]
            if kind == "video" and enc.input_ids[inner[0]:inner[1]].count(model.vision_start_id) \
                    and (block.start, block.end) == (inner[0] - 1, inner[1] + 1):
                tokens = enc.input_ids[inner[0]:inner[1]]
            _check_nesting(model, tokens, f"{kind} {index}")
        blocks.append(block)
    _check_outside(model, enc.input_ids, blocks)
    return blocks


def _grid(model: Model, enc: Encoded, kind: str, index: int, tokens: list[int]) -> list[int]:
    where = f"{kind} {index}"
    if model.family == "qwen_vl":
        grids = enc.image_grid_thw if kind == "image" else enc.video_grid_thw
        if index >= len(grids):
            raise BadSample(f"{where}: the processor returned {len(grids)} {kind} grids")
        grid = [int(v) for v in grids[index]]
        token = model.image_token_id if kind == "image" else model.video_token_id
        merge = model.processor.image_processor.merge_size if kind == "image" \
            else model.processor.video_processor.merge_size
        need = grid[0] * grid[1] * grid[2] // (merge * merge)
        _check_count(where, tokens.count(token), need, f"grid {grid} with merge size {merge}")
        return grid
    count = tokens.count(model.image_token_id)
    if model.family == "llava":
        _check_count(where, count, model.tokens_per_image, f"config.json's vision tower ({model.side} x "
                                                           f"{model.side} patches)")
        return [1, model.side, model.side]
    tiles, rest = divmod(count, model.tokens_per_tile)
    if rest or not tiles:
        raise BadSample(f"{where}: the processor wrote {count} placeholders, not a whole number of tiles of "
                        f"{model.tokens_per_tile}")
    return [tiles, model.side, model.side]


def _check_nesting(model: Model, tokens: list[int], where: str) -> None:
    """Qwen: each <|vision_start|> closed by a <|vision_end|> before the next opens, as the trainer
    parses them. (Qwen3-VL's processor writes a <|vision_start|> per temporal patch; around a
    template's own <|vision_start|><|video_pad|><|vision_end|> that would nest.)"""
    depth = 0
    for t in tokens:
        if t == model.vision_start_id:
            depth += 1
        elif t == model.vision_end_id:
            depth -= 1
        if depth not in (0, 1):
            start = model.tokenizer.convert_ids_to_tokens(model.vision_start_id)
            raise BadSample(f"{where}: the processor nested or unbalanced {start} blocks, which mmsp's trainer "
                            "refuses (the chat template and the processor disagree on who writes them)")
    if depth:
        raise BadSample(f"{where}: a {model.tokenizer.convert_ids_to_tokens(model.vision_start_id)} is not closed")


def _check_count(where: str, have: int, need: int, rule: str) -> None:
    if have != need:
        raise BadSample(f"{where}: the processor wrote {have} placeholders but {rule} needs {need}")


def _check_outside(model: Model, ids: list[int], blocks: list[Block]) -> None:
    vision = {model.image_token_id: None, model.video_token_id: None, model.vision_start_id: None,
              model.vision_end_id: None}
    for name in ("start_image_token_id", "end_image_token_id"):  # InternVL's <img>, </img>
        if isinstance(getattr(model.processor, name, None), int):
            vision[getattr(model.processor, name)] = None
    vision.pop(-1, None)
    inside = bytearray(len(ids))
    for b in blocks:
        inside[b.start:b.end] = b"\x01" * (b.end - b.start)
    for i, t in enumerate(ids):
        if t in vision and not inside[i]:
            token = model.tokenizer.convert_ids_to_tokens(t)
            raise BadSample(f"token {i} is the vision token {token} outside any image or video block: a turn's "
                            "text must not contain the model's vision tokens")
