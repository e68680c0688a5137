"""The input file: a JSON list of records or JSON lines, each record with the line it starts on.

`read_records(path)` yields `(line, record)` pairs, where `record` is a dict or a `BadSample`
saying why that line is not one (so that `--skip-bad` can go on past it). A JSON list that does
not parse cannot be read past its error: that is a `PrepareError`.
"""
import json

from .errors import BadSample, PrepareError


def read_records(path):
    try:
        f = open(path, "rb")
    except OSError as e:
        raise PrepareError(f'cannot read --input "{path}": {e.strerror}') from None
    with f:
        head = f.read(4096).lstrip()
        if head.startswith(b"\xef\xbb\xbf"):
            head = head[3:].lstrip()
        f.seek(0)
        if head.startswith(b"["):
            yield from _json_list(path, f.read())
        else:
            yield from _json_lines(f)


def _json_lines(f):
    for number, raw in enumerate(f, start=1):
        if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            yield number, BadSample(f"not UTF-8 text (byte {e.start + 1})")
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as e:
            yield number, BadSample(f"invalid JSON: {e.msg} at column {e.colno}")
            continue
        yield number, _object(record)


def _json_list(path, data):
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise PrepareError(f'{path}: not UTF-8 text (byte {e.start + 1})') from None
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    line = text.count("\n", 0, pos) + 1
    expect_item = True  # right after "[" or ","
    first = True
    while True:
        pos, line = _skip_space(text, pos, line)
        if pos >= len(text):
            raise PrepareError(f"{path}:{line}: invalid JSON: the list is not closed with ]")
        if text[pos] == "]" and (first or not expect_item):
            break
        if not expect_item:
            if text[pos] != ",":
                raise PrepareError(f"{path}:{line}: invalid JSON: expected , or ] between records")
            pos += 1
            expect_item = True
            continue
        try:
            record, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raise PrepareError(f"{path}:{e.lineno}: invalid JSON: {e.msg} at column {e.colno}") from None
        yield line, _object(record)
        line += text.count("\n", pos, end)
        pos = end
        expect_item = False
        first = False
    pos, line = _skip_space(text, pos + 1, line)
    if pos < len(text):
        raise PrepareError(f"{path}:{line}: invalid JSON: text after the closing ]")


def _skip_space(text, pos, line):
    while pos < len(text) and text[pos] in " \t\r\n":
        if text[pos] == "\n":
            line += 1
        pos += 1
    return pos, line


def _object(record):
    if not isinstance(record, dict):
        return BadSample(f"a record must be a JSON object, not {_json_type(record)}")
    return record


def _json_type(value):
    return {list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")
