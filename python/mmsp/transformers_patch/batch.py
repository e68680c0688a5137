"""The collator's padded batch -> mmsp's batch {"sequences": [...]}, checked: right padding,
token ids inside the model's vocabulary, labels that are the input's next tokens (or -100),
and placeholders that match the grids (read by the family's kind)."""

from typing import Any

from mmsp.transformers_patch.families import Family


def _lengths(attention_mask, B: int, T: int) -> list[int]:
    lengths = [T] * B
    if attention_mask is None:
        return lengths
    for b in range(B):
        row = attention_mask[b].tolist()
        n = int(sum(row))
        if row != [1] * n + [0] * (T - n):
            raise ValueError(f"mmsp.patch: attention_mask row {b} is not right padding (ones, then zeros); "
                             "pad on the right")
        lengths[b] = n
    return lengths


def _check_labels(b: int, ids: list[int], lab: list[int]) -> None:
    for t, (i, l) in enumerate(zip(ids, lab)):
        if l != -100 and l != i:
            raise ValueError(f"mmsp.patch: labels[{b}, {t}] = {l} differs from input_ids {i}; mmsp trains the "
                             "next token of the input (labels = input_ids, -100 where no loss is taken)")


def _check_vocabulary(b: int, ids: list[int], vocab: int) -> None:
    bad = next((t for t, i in enumerate(ids) if not 0 <= i < vocab), None)
    if bad is not None:
        raise ValueError(f"mmsp.patch: input_ids[{b}, {bad}] = {ids[bad]} is outside the model's vocabulary "
                         f"0..{vocab - 1} (the input embedding's rows); the tokenizer and the model must be the "
                         "same model's")


def sequences(config: Any, family: Family, vocab: int, input_ids, attention_mask, labels, image_grid_thw,
              video_grid_thw=None, second_per_grid_ts=None, **pixels: Any) -> dict[str, Any]:
    """The batch in mmsp's format; `vocab`: the input embedding's rows (every id below it);
    `pixels` (pixel_values, pixel_values_videos) are the caller's: not read here."""
    B, T = input_ids.shape
    if labels is None or tuple(labels.shape) != (B, T):
        raise ValueError(f"mmsp.patch: labels {None if labels is None else tuple(labels.shape)} must be given, "
                         f"shaped as input_ids {(B, T)} (-100 where no loss is taken)")
    lengths = _lengths(attention_mask, B, T)
    reader = family.rules.reader(config, family, image_grid_thw, video_grid_thw, second_per_grid_ts)
    out = []
    for b in range(B):
        n = lengths[b]
        ids, lab = input_ids[b, :n].tolist(), labels[b, :n].tolist()
        _check_vocabulary(b, ids, vocab)
        _check_labels(b, ids, lab)
        seq = {"input_ids": ids, "loss_mask": [0] + [int(l != -100) for l in lab[1:]]}
        seq.update(reader.of_sequence(b, ids))
        out.append(seq)
    reader.finish()
    return {"sequences": out}
