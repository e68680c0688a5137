"""Input records → one `Chat` (roles and content parts) or one `Text`, whatever the input format.

Formats (docs/prepare.md):

- `llava`: `{"conversations": [{"from": "human", "value": "<image>\\nWhat is this?"}, ...],
  "image": "cat.png"}` (or `"images": [...]`, `"video"` / `"videos"`);
- `messages` (OpenAI / ShareGPT): `{"messages": [{"role": "user", "content": [{"type": "image",
  "image": "a.png"}, {"type": "text", "text": "..."}]}, ...]}`, or string contents with
  `<image>` / `<video>` markers and top-level `"images"` / `"videos"`;
- `text`: `{"text": "..."}`, every token a target.

An assistant turn may carry its reasoning: `"reasoning_content"` beside its text, or a
`<think>...</think>` block opening the text (reasoning.py checks both).

Nothing here touches a file: media sources stay as the record gives them (media.py resolves
and loads them).
"""
import re
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from . import reasoning
from .errors import BadSample
from .reader import Record

FORMATS = ("auto", "llava", "messages", "text")

ROLES = {"user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant", "system": "system"}

# Markers in text stand for the record's top-level images / videos, in order. A newline right
# after a marker is dropped: the chat templates put their own separators around vision blocks
# (LLaVA's writes "<image>\n" itself), so keeping it would double it.
_MARKER = re.compile(r"(<image>|<video>)\n?")


@dataclass
class Part:
    kind: str  # "text", "image" or "video"
    text: str = ""
    source: object = None  # image: a path; video: a folder or a list of frame paths
    where: str = ""  # how errors name it: 'message 2 image 0'


@dataclass
class Message:
    role: str
    parts: list[Part] = field(default_factory=list)
    reasoning: Optional[str] = None  # "reasoning_content", passed to the template as it is


@dataclass
class Chat:
    messages: list[Message]

    def media(self, kind: str) -> list[Part]:
        return [p for m in self.messages for p in m.parts if p.kind == kind]


@dataclass
class Text:
    text: str


def detect(record: Record) -> str:
    keys = [k for k in ("conversations", "messages") if k in record]
    if len(keys) == 2:
        raise BadSample('the record has both "conversations" and "messages": pick one with --format')
    if keys:
        return "llava" if keys[0] == "conversations" else "messages"
    if "text" in record:
        return "text"
    shown = ", ".join(f'"{k}"' for k in list(record)[:8]) or "none"
    raise BadSample('cannot tell the format: a record needs "conversations" (llava), "messages" or '
                    f'"text" (its keys: {shown})')


def parse(record: Record, fmt: str = "auto") -> Union[Chat, Text]:
    """One record → `Chat` or `Text`; raises `BadSample` naming the value and the rule."""
    if fmt == "auto":
        fmt = detect(record)
    if fmt == "text":
        return _text(record)
    if fmt == "llava":
        turns = _list_field(record, "conversations")
        messages = [_llava_turn(i, t) for i, t in enumerate(turns)]
    else:
        turns = _list_field(record, "messages")
        messages = [_message(i, m) for i, m in enumerate(turns)]
    chat = Chat(messages)
    _assign_media(chat, "image", _top_level(record, "image", "images"))
    _assign_media(chat, "video", _top_level(record, "video", "videos"))
    _check_turns(chat)
    return chat


def _text(record: Record) -> Text:
    if "text" not in record:
        raise BadSample('--format text needs a "text" field')
    text = record["text"]
    if not isinstance(text, str):
        raise BadSample(f'"text" must be a string, not {_type(text)}')
    for key in ("image", "images", "video", "videos"):
        if record.get(key):
            raise BadSample(f'a "text" record cannot have "{key}": use "messages" or "conversations" '
                            "for samples with images or videos")
    if not text:
        raise BadSample('"text" is empty')
    return Text(text)


def _list_field(record: Record, key: str) -> list[Any]:
    if key not in record:
        raise BadSample(f'--format {"llava" if key == "conversations" else "messages"} needs a "{key}" field')
    value = record[key]
    if not isinstance(value, list) or not value:
        raise BadSample(f'"{key}" must be a non-empty list of turns, not {_type(value)}')
    return value


def _role(i: int, value: object) -> str:
    if not isinstance(value, str) or value.lower() not in ROLES:
        raise BadSample(f"turn {i}: unknown role {_show(value)} (expected user/human, assistant/gpt or system)")
    return ROLES[value.lower()]


def _llava_turn(i: int, turn: object) -> Message:
    if not isinstance(turn, dict):
        raise BadSample(f"turn {i}: a turn must be an object, not {_type(turn)}")
    role = _role(i, turn.get("from", turn.get("role")))
    value = turn.get("value", turn.get("content"))
    if not isinstance(value, str):
        raise BadSample(f'turn {i}: "value" must be a string, not {_type(value)}')
    return Message(role, _with_markers(value), reasoning.read(i, role, turn, value))


def _message(i: int, message: object) -> Message:
    if not isinstance(message, dict):
        raise BadSample(f"turn {i}: a message must be an object, not {_type(message)}")
    role = _role(i, message.get("role"))
    content = message.get("content")
    if isinstance(content, str):
        return Message(role, _with_markers(content), reasoning.read(i, role, message, content))
    if not isinstance(content, list):
        raise BadSample(f'turn {i}: "content" must be a string or a list of parts, not {_type(content)}')
    parts: list[Part] = []
    for j, part in enumerate(content):
        if isinstance(part, str):
            parts += _with_markers(part)
            continue
        if not isinstance(part, dict):
            raise BadSample(f"turn {i} part {j}: a part must be an object, not {_type(part)}")
        kind = part.get("type")
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise BadSample(f'turn {i} part {j}: "text" must be a string, not {_type(part.get("text"))}')
            parts += _with_markers(part["text"])
        elif kind in ("image", "image_url"):
            source = part.get("image", part.get("path", part.get("url")))
            if kind == "image_url":
                url = part.get("image_url")
                source = url.get("url") if isinstance(url, dict) else url
            parts.append(Part("image", source=source))
        elif kind == "video":
            parts.append(Part("video", source=part.get("video", part.get("path"))))
        else:
            raise BadSample(f"turn {i} part {j}: unknown content type {_show(kind)} (expected text, image or video)")
    text = "".join(p.text for p in parts if p.kind == "text")  # what the template joins and reads
    return Message(role, parts, reasoning.read(i, role, message, text))


def _with_markers(text: str) -> list[Part]:
    parts: list[Part] = []
    pos = 0
    for m in _MARKER.finditer(text):
        if m.start() > pos:
            parts.append(Part("text", text=text[pos:m.start()]))
        parts.append(Part(m.group(1)[1:-1]))  # no source: the next top-level item
        pos = m.end()
    if pos < len(text):
        parts.append(Part("text", text=text[pos:]))
    return parts


def _top_level(record: Record, one: str, many: str) -> list[Any]:
    if one in record and many in record:
        raise BadSample(f'the record has both "{one}" and "{many}": give one list')
    if many in record:
        value = record[many]
        if not isinstance(value, list):
            raise BadSample(f'"{many}" must be a list, not {_type(value)}')
        return value
    if one in record:
        value = record[one]
        # "image": a path or a list of paths; "video": one video (a folder or a list of frames).
        if one == "image" and isinstance(value, list):
            return value
        return [value]
    return []


def _assign_media(chat: Chat, kind: str, pool: list[Any]) -> None:
    parts = chat.media(kind)
    from_pool = [p for p in parts if p.source is None]
    if len(from_pool) != len(pool):
        marker = f"<{kind}>"
        raise BadSample(f"{_count(len(from_pool), marker + ' marker')} but {_count(len(pool), kind)} in the record "
                        f"(each {marker} marker, or {kind} part without a path, takes the next one)")
    for part, source in zip(from_pool, pool):
        part.source = source
    for n, part in enumerate(parts):
        part.where = f"{kind} {n}"


def _check_turns(chat: Chat) -> None:
    for i, m in enumerate(chat.messages):
        if m.role == "assistant" and any(p.kind != "text" for p in m.parts):
            raise BadSample(f"turn {i} (assistant): images and videos belong in user or system turns")
    roles = [m.role for m in chat.messages if m.role != "system"]
    if "assistant" not in roles:
        raise BadSample("no assistant turn: nothing to learn")
    if roles[0] != "user":
        raise BadSample("the first turn after the system turns is an assistant turn: a user turn must come first")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _type(value: object) -> str:
    return {list: "a list", dict: "an object", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def _show(value: object) -> str:
    return f'"{value}"' if isinstance(value, str) else _type(value)
