"""The input file: a JSON list of records or JSON lines, each record with the line it starts on.

`read_records(path, max_record_bytes)` yields `(line, record)` pairs, where `record` is a dict
or a `BadSample` saying why that line is not one (so that `--skip-bad` can go on past it). A
JSON list whose structure does not parse cannot be read past its error: that is a
`PrepareError`.

Memory is bounded by the record, not the file: JSON lines are read a line at a time, a JSON list
is scanned in chunks for where each record ends, and a record longer than `max_record_bytes` is
never held whole, let alone parsed (its bytes are counted and dropped; it is a `BadSample`
naming its size). A record is parsed by the rules of mmsp's own JSON reader
(include/mmsp/core/json_read.h): at most 64 levels of nesting, a key at most once in an object,
no NaN or Infinity; and, as valid Unicode text, no lone UTF-16 surrogate escape ("\\ud800").
"""
import json
import re
from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO, NoReturn, Optional, Union

from .errors import BadSample, PrepareError
from .train_bounds import MAX_JSON_DEPTH

_CHUNK = 1 << 20  # bytes read at a time
_BOM = b"\xef\xbb\xbf"
_SPACE = b" \t\r\n"
_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
# Outside a string: what changes the depth or ends a list item, a whole string, or the opening
# quote of a string that does not end in the bytes at hand.
_TOKEN = re.compile(rb'[\[\]{},]|"[^"\\]*(?:\\.[^"\\]*)*"|"')
_QUOTE, _BACKSLASH, _COMMA, _OPEN = ord('"'), ord("\\"), ord(","), b"[{"
# Inside a string: what ends it or escapes the next byte.
_IN_STRING = re.compile(rb'["\\]')
_NOT_SPACE = re.compile(rb'[^ \t\r\n]')

# A record: a JSON object as the decoder gives it (its values any JSON value).
Record = dict[str, Any]
# What read_records yields per record: its first line, and the record or why it is none.
Numbered = tuple[int, Union[Record, BadSample]]


def read_records(path: str, max_record_bytes: int) -> Iterator[Numbered]:
    try:
        f = open(path, "rb")
    except OSError as e:
        raise PrepareError(f'cannot read --input "{path}": {e.strerror}') from None
    with f:
        first = _first_byte(f)
        if first == b"[":
            yield from _json_list(path, f, max_record_bytes)
        else:
            yield from _json_lines(f, max_record_bytes)


def read_json_file(path: str, what: str, limit: int) -> Record:
    """A whole JSON file of the model directory (config.json), by the records' rules: at most
    `limit` bytes, read before parsing; then the depth, repeated keys, constants and surrogates
    of `_record`. A PrepareError names the file and the rule."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise PrepareError(f'cannot read "{path}": {e.strerror}') from None
    if len(data) > limit:
        raise PrepareError(f"{path}: more than {limit:,} bytes; no {what} is that large")
    if data.startswith(_BOM):
        data = data[len(_BOM):]
    value = _record(data, 1, fatal_path=path)
    if isinstance(value, BadSample):
        raise PrepareError(f"{path}: {str(value).replace('a record must', f'{what} must')}")
    return value


def _first_byte(f: BinaryIO) -> bytes:
    """The first byte after a BOM and white space (the file is rewound)."""
    head = f.read(len(_BOM))
    if not head.startswith(_BOM):
        f.seek(0)
    while True:
        block = f.read(4096)
        stripped = block.lstrip(_SPACE)
        if stripped or not block:
            f.seek(0)
            return stripped[:1]


def _too_long(size: int, limit: int) -> BadSample:
    return BadSample(f"the record is {size:,} bytes, more than --max-record-bytes {limit:,} (a record is held, "
                     "rendered and tokenized whole in memory, at about 180 times its size): split it, or "
                     "raise the limit")


def _json_lines(f: BinaryIO, limit: int) -> Iterator[Numbered]:
    number = 0
    while True:
        raw = f.readline(limit + 3)  # the line, its \r\n, and one byte to tell it is longer
        if not raw:
            return
        number += 1
        if number == 1 and raw.startswith(_BOM):
            raw = raw[len(_BOM):]
        if not raw.endswith(b"\n") and len(raw) >= limit + 3:
            size = len(raw)
            while not raw.endswith(b"\n"):  # the rest of the line, counted and dropped
                raw = f.readline(_CHUNK)
                if not raw:
                    break
                size += len(raw)
            size -= 2 if raw.endswith(b"\r\n") else 1 if raw.endswith(b"\n") else 0
            yield number, _too_long(size, limit)
            continue
        line = raw.rstrip(b"\r\n")
        if not line.strip(_SPACE):
            continue
        if len(line) > limit:
            yield number, _too_long(len(line), limit)
            continue
        yield number, _record(line, 1)


def _record(data: bytes, first_line: int, fatal_path: Optional[str] = None) -> Union[Record, BadSample]:
    """One record's bytes → its dict, or a BadSample. With `fatal_path` (a record of a JSON list,
    where a syntax error leaves nothing to resync on), invalid JSON is a PrepareError."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        return BadSample(f"not UTF-8 text (byte {e.start + 1})")
    try:
        record = _DECODER.decode(text)
    except _Refused as e:
        return BadSample(str(e))
    except RecursionError:
        return _too_deep()
    except json.JSONDecodeError as e:
        message = f"invalid JSON: {e.msg} at column {e.colno}"
        if fatal_path is not None:
            raise PrepareError(f"{fatal_path}:{first_line + e.lineno - 1}: {message}") from None
        return BadSample(message)
    # The walk only where the text allows a problem: more brackets than the depth limit, or a
    # \\ud800-\\udfff escape (UTF-8 itself cannot hold a surrogate: decode refuses one).
    if data.count(b"[") + data.count(b"{") > MAX_JSON_DEPTH or _SURROGATE_ESCAPE.search(data):
        problem = _check_values(record)
        if problem is not None:
            return problem
    if not isinstance(record, dict):
        return BadSample(f"a record must be a JSON object, not {_json_type(record)}")
    return record


class _Refused(Exception):
    pass


def _object_without_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                shown = key if len(key) <= 80 else key[:77] + "..."
                raise _Refused(f'the key {json.dumps(shown, ensure_ascii=True)} appears twice in one object (which '
                               "one is meant?)")
            seen.add(key)
    return out


def _no_constant(name: str) -> NoReturn:
    raise _Refused(f"invalid JSON: {name} is not a JSON number")


_DECODER = json.JSONDecoder(object_pairs_hook=_object_without_repeats, parse_constant=_no_constant)


def _too_deep() -> BadSample:
    return BadSample(f"JSON nests deeper than {MAX_JSON_DEPTH} levels; no mmsp input needs that many")


def _check_values(record: object) -> Optional[BadSample]:
    """Nesting and strings, without recursion: a BadSample or None."""
    stack: list[tuple[object, int, str]] = [(record, 1, "")]
    while stack:
        value, depth, where = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > MAX_JSON_DEPTH:
                return _too_deep()
            items: Iterable[tuple[object, object]] = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                if isinstance(key, str):
                    bad = _lone_surrogate(key, f"a key in {where or 'the record'}")
                    if bad:
                        return bad
                    stack.append((item, depth + 1, f"{where}.{key}" if where else key))
                else:
                    stack.append((item, depth + 1, f"{where}[{key}]"))
        elif isinstance(value, str):
            bad = _lone_surrogate(value, where or "the record")
            if bad:
                return bad
    return None


def _lone_surrogate(text: str, where: str) -> Optional[BadSample]:
    m = _SURROGATE.search(text)
    if m is None:
        return None
    return BadSample(f"{where}: the string holds a lone UTF-16 surrogate \\u{ord(m.group()):04x} (at character "
                     f"{m.start()}), which is not Unicode text: a JSON \\ud800-\\udbff escape must be followed by "
                     "a \\udc00-\\udfff one")


class _ListScanner:
    """A JSON list, read in chunks: each item's bytes (up to a limit), its first line and size.

    Only what delimits items is followed: strings (and their escapes), brackets, and the commas
    at the list's own level. Each item is then parsed on its own (`_record`), so that a bad item
    is named by its line and `--skip-bad` goes past it; a broken structure is a PrepareError."""

    def __init__(self, path: str, f: BinaryIO, limit: int) -> None:
        self.path, self.f, self.limit = path, f, limit
        self.chunk, self.pos = b"", 0
        self.line, self.counted = 1, 0  # the line at self.chunk[self.counted]

    def _fill(self) -> bool:
        """Bytes at self.pos, reading the next chunk when this one is done; False at the end."""
        if self.pos < len(self.chunk):
            return True
        self.line += self.chunk.count(b"\n", self.counted)
        self.chunk, self.pos, self.counted = self.f.read(_CHUNK), 0, 0
        return bool(self.chunk)

    def line_at(self, pos: int) -> int:
        """The line of self.chunk[pos] (pos never goes back)."""
        self.line += self.chunk.count(b"\n", self.counted, pos)
        self.counted = pos
        return self.line

    def next_byte(self) -> bytes:
        """The next byte that is not white space (self.pos moves to it), or b"" at the end."""
        while self._fill():
            m = _NOT_SPACE.search(self.chunk, self.pos)
            if m:
                self.pos = m.start()
                return self.chunk[self.pos:self.pos + 1]
            self.pos = len(self.chunk)
        return b""

    def where(self) -> str:
        return f"{self.path}:{self.line_at(self.pos)}"

    def open(self) -> bool:
        if not self.f.read(len(_BOM)).startswith(_BOM):
            self.f.seek(0)
        if self.next_byte() != b"[":
            raise PrepareError(f"{self.where()}: invalid JSON: expected [")
        self.pos += 1
        if self.next_byte() == b"]":  # an empty list
            self.pos += 1
            return False
        return True

    def item(self) -> tuple[int, Optional[bytes], int, int, bool]:
        """The next item: (its first line, its bytes or None when over the limit, its size, its
        deepest nesting, and whether the list goes on after it)."""
        if not self.next_byte():
            raise PrepareError(f"{self.where()}: invalid JSON: the list is not closed with ]")
        first_line = self.line_at(self.pos)
        parts: Optional[list[bytes]] = []  # None once the item is over the limit
        size, depth, deepest = 0, 0, 0
        in_string = escaped = False  # inside a string that does not end in the chunk at hand
        while self._fill():
            chunk, at = self.chunk, self.pos
            end: Optional[int] = None
            while end is None:
                while in_string:  # byte by byte (a string across chunks): to its end, or the chunk's
                    if escaped:
                        if at == len(chunk):  # the escaped byte is the next chunk's first
                            break
                        at, escaped = at + 1, False
                    m = _IN_STRING.search(chunk, at)
                    if m is None:
                        break
                    at = m.end()
                    escaped = in_string = chunk[m.start()] == _BACKSLASH
                if in_string:
                    break
                for m in _TOKEN.finditer(chunk, at):
                    a, b = m.span()
                    c = chunk[a]
                    if c == _QUOTE:
                        if b - a == 1:  # a string that does not end in this chunk
                            in_string, at = True, b
                            break
                    elif c in _OPEN:
                        depth += 1
                        if depth > deepest:
                            deepest = depth
                    elif depth:
                        depth -= c != _COMMA
                    else:  # a , ] or } at the list's own level ends the item
                        end = a
                        break
                else:
                    break
            stop = len(chunk) if end is None else min(end, len(chunk))
            size += stop - self.pos
            if parts is not None:
                parts.append(chunk[self.pos:stop])
                if size > self.limit + 1024:  # over the limit even without trailing white space
                    parts = None
            if end is None:
                self.line_at(len(chunk))
                self.pos = len(chunk)
                continue
            self.pos = end + 1
            delimiter = chunk[end:end + 1]
            if delimiter == b"}":
                raise PrepareError(f"{self.path}:{self.line_at(end)}: invalid JSON: a }} that closes nothing")
            data = b"".join(parts).rstrip(_SPACE) if parts is not None else None
            if not data and data is not None:
                raise PrepareError(f"{self.path}:{first_line}: invalid JSON: expected a record before "
                                   f"{delimiter.decode()}")
            return first_line, data, len(data) if data is not None else size, deepest, delimiter == b","
        raise PrepareError(f"{self.path}:{first_line}: invalid JSON: the list is not closed with ] (this record "
                           "runs to the end of the file)")

    def tail(self) -> None:
        """Nothing but white space after the closing ]."""
        if self.next_byte():
            raise PrepareError(f"{self.where()}: invalid JSON: text after the closing ]")


def _json_list(path: str, f: BinaryIO, limit: int) -> Iterator[Numbered]:
    scan = _ListScanner(path, f, limit)
    more = scan.open()
    while more:
        line, data, size, deepest, more = scan.item()
        if data is None or size > limit:  # (no bytes: the item was over the limit)
            yield line, _too_long(size, limit)
        elif deepest > MAX_JSON_DEPTH:
            yield line, _too_deep()
        else:
            yield line, _record(data, line, fatal_path=path)
    scan.tail()


def _json_type(value: object) -> str:
    return {list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")
