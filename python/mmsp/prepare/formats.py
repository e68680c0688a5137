"""Input records → one `Chat` (roles and content parts) or one `Text`, whatever the input format.

Formats (docs/prepare.md):

- `llava`: `{"conversations": [{"from": "human", "value": "<image>\\nWhat is this?"}, ...],
  "image": "cat.png"}` (or `"images": [...]`, `"video"` / `"videos"`);
- `messages` (OpenAI / ShareGPT): `{"messages": [{"role": "user", "content": [{"type": "image",
  "image": "a.png"}, {"type": "text", "text": "..."}]}, ...]}`, or string contents with
  `<image>` / `<video>` markers and top-level `"images"` / `"videos"`;
- `text`: `{"text": "..."}`, every token a target;
- `preference` (TRL's preference format, for DPO): `{"prompt": [messages], "chosen": [messages],
  "rejected": [messages], "images": [...]}`, or `{"prompt": str, "chosen": str, "rejected": str}`;
  without "prompt" it is the turns (or characters) that chosen and rejected share (pairs.py
  tokenizes it).

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

FORMATS = ("auto", "llava", "messages", "text", "preference")

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


@dataclass
class Preference:
    """One preference record: a prompt and two completions, as TRL's DPO reads it."""
    prompt: Union[Chat, str]  # conversational: the prompt's turns with their images; standard: text
    chosen: Union[list[Message], str]  # conversational: assistant turns; standard: text
    rejected: Union[list[Message], str]
    vision: bool  # the record has "image" / "images": TRL's vision collator tokenizes it (pairs.py)


def detect(record: Record) -> str:
    keys = [k for k in ("conversations", "messages") if k in record]
    if len(keys) == 2:
        raise BadSample('the record has both "conversations" and "messages": pick one with --format')
    if keys:
        return "llava" if keys[0] == "conversations" else "messages"
    if "chosen" in record or "rejected" in record:
        return "preference"
    if "text" in record:
        return "text"
    shown = ", ".join(f'"{k}"' for k in list(record)[:8]) or "none"
    raise BadSample('cannot tell the format: a record needs "conversations" (llava), "messages", "text" or '
                    f'"chosen" and "rejected" (preference) (its keys: {shown})')


def parse(record: Record, fmt: str = "auto") -> Union[Chat, Text, Preference]:
    """One record → `Chat`, `Text` or `Preference`; raises `BadSample` naming the value and the rule."""
    if fmt == "auto":
        fmt = detect(record)
    if fmt == "text":
        return _text(record)
    if fmt == "preference":
        return _preference(record)
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


def _message(i: int, message: object, markers: bool = True) -> Message:
    """`markers`: read <image> / <video> in the text as markers (TRL's preference records: text)."""
    split = _with_markers if markers else _plain
    if not isinstance(message, dict):
        raise BadSample(f"turn {i}: a message must be an object, not {_type(message)}")
    role = _role(i, message.get("role"))
    content = message.get("content")
    if isinstance(content, str):
        return Message(role, split(content), reasoning.read(i, role, message, content))
    if not isinstance(content, list):
        raise BadSample(f'turn {i}: "content" must be a string or a list of parts, not {_type(content)}')
    parts: list[Part] = []
    for j, part in enumerate(content):
        if isinstance(part, str):
            parts += split(part)
            continue
        if not isinstance(part, dict):
            raise BadSample(f"turn {i} part {j}: a part must be an object, not {_type(part)}")
        kind = part.get("type")
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise BadSample(f'turn {i} part {j}: "text" must be a string, not {_type(part.get("text"))}')
            parts += split(part["text"])
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


def _plain(text: str) -> list[Part]:
    return [Part("text", text=text)] if text else []


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


# --- preference records (TRL's format, trl/data_utils.py) -----------------------------------------

_SIDES = ("prompt", "chosen", "rejected")


def _preference(record: Record) -> Preference:
    """TRL's preference record: conversational (lists of messages, and "image" / "images") or
    standard (strings), with an explicit prompt or an implicit one (TRL's `extract_prompt`)."""
    missing = [k for k in ("chosen", "rejected") if k not in record]
    if missing:
        have = ", ".join(f'"{k}"' for k in _SIDES if k in record) or "neither side"
        raise BadSample(f'a preference record needs "chosen" and "rejected": "{missing[0]}" is missing '
                        f"(it has {have})")
    for key in ("videos", "video"):
        if key in record:
            raise BadSample(f'a preference record cannot have "{key}": TRL\'s DPO takes images only')
    for key in ("tools", "chat_template_kwargs"):
        if key in record:
            raise BadSample(f'a preference record\'s "{key}" is not supported (mmsp prepare renders no tools and '
                            "passes the template only --enable-thinking)")
    given = [k for k in _SIDES if k in record]
    kinds = {k: "string" if isinstance(record[k], str) else "list" if isinstance(record[k], list) else _type(record[k])
             for k in given}
    for k in given:
        if kinds[k] not in ("string", "list"):
            raise BadSample(f'"{k}" must be a list of messages or a string, not {kinds[k]}')
    if len(set(kinds.values())) > 1:
        shown = ", ".join(f'"{k}" is a {kinds[k]}' for k in given)
        raise BadSample(f"{shown}: give them all as lists of messages (conversational) or all as strings (standard)")
    if kinds["chosen"] == "string":
        return _standard_preference(record)
    return _conversational_preference(record)


def _standard_preference(record: Record) -> Preference:
    for key in ("image", "images"):
        if key in record:
            raise BadSample(f'a standard (string) preference record cannot have "{key}": give "prompt", "chosen" and '
                            '"rejected" as lists of messages for images')
    chosen, rejected = record["chosen"], record["rejected"]
    if chosen == rejected:
        raise BadSample('"chosen" and "rejected" are the same: nothing to prefer')
    if "prompt" in record:
        prompt = record["prompt"]
    else:  # TRL's extract_prompt: the characters they share, less a blank they end on
        at = next((i for i, (a, b) in enumerate(zip(chosen, rejected)) if a != b), min(len(chosen), len(rejected)))
        if at > 0 and chosen[at - 1] == " ":
            at -= 1
        prompt, chosen, rejected = chosen[:at], chosen[at:], rejected[at:]
    for key, value in (("prompt", prompt), ("chosen", chosen), ("rejected", rejected)):
        if not value:
            raise BadSample(f'"{key}" is empty' + (" (no \"prompt\", and chosen and rejected share no text to be it)"
                                                   if key == "prompt" and "prompt" not in record else ""))
    return Preference(prompt, chosen, rejected, vision=False)


def _conversational_preference(record: Record) -> Preference:
    sides: dict[str, list[Any]] = {}
    for key in _SIDES:
        if key in record:
            if not record[key]:
                raise BadSample(f'"{key}" is empty: it needs at least one message')
            sides[key] = record[key]
    if sides["chosen"] == sides["rejected"]:
        raise BadSample('"chosen" and "rejected" are the same: nothing to prefer')
    if "prompt" not in sides:  # TRL's extract_prompt: the turns they share
        chosen, rejected = sides["chosen"], sides["rejected"]
        at = next((i for i, (a, b) in enumerate(zip(chosen, rejected)) if a != b), min(len(chosen), len(rejected)))
        if at == 0:
            raise BadSample('no "prompt", and "chosen" and "rejected" share no first turn to be it')
        sides = {"prompt": chosen[:at], "chosen": chosen[at:], "rejected": rejected[at:]}
        for key in ("chosen", "rejected"):
            if not sides[key]:
                raise BadSample(f'no "prompt", and "{key}" holds no turn past the turns it shares with the other side')
    images = _top_level(record, "image", "images")
    prompt = [_side_message("prompt", i, m) for i, m in enumerate(_trl_images(sides["prompt"], len(images)))]
    chat = Chat(prompt)
    slots = [p for p in chat.media("image") if p.source is None]
    if len(slots) != len(images):
        raise BadSample(f'"prompt" has {_count(len(slots), "image part")} without a path but the record has '
                        f"{_count(len(images), 'image')} (each takes the next one; with a string content, the first "
                        "user turn takes them all, before its text)")
    _assign_media(chat, "image", images)
    completions: dict[str, list[Message]] = {}
    for key in ("chosen", "rejected"):
        completions[key] = [_side_message(key, i, m) for i, m in enumerate(sides[key])]
        for i, m in enumerate(completions[key]):
            if m.role != "assistant":
                raise BadSample(f'"{key}" turn {i} is a {m.role} turn: a completion holds assistant turns only')
            if any(p.kind != "text" for p in m.parts):
                raise BadSample(f'"{key}" turn {i}: images and videos belong in the prompt')
        if not any(p.text.strip() for m in completions[key] for p in m.parts) \
                and not any((m.reasoning or "").strip() for m in completions[key]):
            raise BadSample(f'"{key}" is empty: its turns hold no text')
    roles = [m.role for m in prompt if m.role != "system"]
    if not roles or roles[0] != "user":
        raise BadSample('"prompt" needs a user turn before any assistant turn')
    if prompt[-1].role != "user":
        article = "an" if prompt[-1].role == "assistant" else "a"
        raise BadSample(f'"prompt" ends with {article} {prompt[-1].role} turn: its last turn must be a user turn '
                        "(the completions answer it)")
    if chat.media("video"):
        raise BadSample("\"prompt\" holds a video: TRL's DPO takes images only")
    return Preference(chat, completions["chosen"], completions["rejected"], vision="image" in record or "images" in record)


def _trl_images(messages: list[Any], count: int) -> list[Any]:
    """TRL's `prepare_multimodal_messages`: the record's images go before the text of the first
    user turn whose content is a string (image parts without a path take them otherwise)."""
    out = list(messages)
    for i, m in enumerate(out):
        if isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), str):
            out[i] = {**m, "content": [{"type": "image"}] * count + [{"type": "text", "text": m["content"]}]}
            break
    return out


def _side_message(key: str, i: int, message: object) -> Message:
    try:
        return _message(i, message, markers=False)
    except BadSample as e:
        raise BadSample(f'"{key}" {e}') from None


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _type(value: object) -> str:
    return {list: "a list", dict: "an object", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def _show(value: object) -> str:
    return f'"{value}"' if isinstance(value, str) else _type(value)
