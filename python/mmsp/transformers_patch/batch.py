"""The collator's padded batch -> mmsp's batch {"sequences": [...]}, checked: token ids inside
the model's vocabulary, labels that are the input's next tokens (or -100), and placeholders that
match the grids (read by the family's kind). A row's tokens are its columns whose
attention_mask is 1: right padding (a collator's) or left padding (TRL's and verl's prompts)."""

from typing import Any

from mmsp.transformers_patch.families import Family


def _columns(attention_mask, B: int, T: int) -> list:
    """Each row's token columns: a slice for ones then zeros (right padding), else the list of
    the columns whose mask is 1 (left padding, or both)."""
    if attention_mask is None:
        return [slice(0, T)] * B
    out: list = []
    for b in range(B):
        row = attention_mask[b].tolist()
        if any(m not in (0, 1) for m in row):
            raise ValueError(f"mmsp.patch: attention_mask row {b} holds values other than 0 and 1")
        n = int(sum(row))
        out.append(slice(0, n) if row == [1] * n + [0] * (T - n) else [t for t, m in enumerate(row) if m])
    return out


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
    columns = _columns(attention_mask, B, T)
    reader = family.rules.reader(config, family, image_grid_thw, video_grid_thw, second_per_grid_ts)
    out = []
    for b in range(B):
        ids, lab = input_ids[b, columns[b]].tolist(), labels[b, columns[b]].tolist()
        _check_vocabulary(b, ids, vocab)
        _check_labels(b, ids, lab)
        seq = {"input_ids": ids, "loss_mask": [0] + [int(l != -100) for l in lab[1:]]}
        seq.update(reader.of_sequence(b, ids))
        out.append(seq)
    reader.finish()
    return {"sequences": out}
