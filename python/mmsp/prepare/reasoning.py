"""Reasoning traces: an assistant turn's `reasoning_content`, or the `<think>...</think>` block that
opens its text, checked as the released Qwen3.5 template reads them; and the template arguments
(`--enable-thinking`) and empty-think choice (`--empty-think`) that go with them (docs/prepare-reasoning.md).

The template renders a turn's reasoning as `<think>\\nREASONING\\n</think>\\n\\nANSWER`. It reads
`reasoning_content` when it is a string, else splits the text at `</think>`: reasoning is what
lies between `<think>` and the first `</think>`, the answer what follows the last. Text outside
those places is dropped without a word, so such a turn is a bad record here, as are reasoning on
a user or system turn and a turn that gives its reasoning twice.
"""
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Optional

from .errors import BadSample, PrepareError
from .model import Processor

if TYPE_CHECKING:  # formats imports this module
    from .formats import Message

OPEN, CLOSE = "<think>", "</think>"

# train: a kept turn without reasoning learns its empty think block, i.e. to close the block at
# once (LLaMA-Factory with enable_thinking); mask: the block is no target (ms-swift's
# ignore_empty_think; LLaMA-Factory without enable_thinking puts it in the prompt: the same mask).
EMPTY_THINK = ("mask", "train")


def read(i: int, role: str, turn: dict[str, Any], text: str) -> Optional[str]:
    """The turn's `reasoning_content` (None when it has none) after checking the turn's reasoning;
    `text` is the turn's text as the template sees it."""
    value = turn.get("reasoning_content")
    if value is not None:
        if role != "assistant":
            raise BadSample(f'turn {i} ({role}): "reasoning_content" belongs in assistant turns (the model\'s '
                            "reasoning before its answer)")
        if not isinstance(value, str):
            raise BadSample(f'turn {i}: "reasoning_content" must be a string, not {_type(value)}')
        for tag in (OPEN, CLOSE):
            if tag in value:
                raise BadSample(f'turn {i}: "reasoning_content" contains "{tag}": give the reasoning without '
                                "think tags (the template writes them)")
    if role != "assistant":
        return value
    opens, closes = text.count(OPEN), text.count(CLOSE)
    if value is not None and (opens or closes):
        raise BadSample(f'turn {i}: both "reasoning_content" and {OPEN if opens else CLOSE} in the text: give the '
                        'reasoning once (with "reasoning_content" the template keeps the think tags in the answer)')
    if not opens and not closes:
        return value
    if closes != 1 or opens > 1:
        raise BadSample(f'turn {i}: {opens} "{OPEN}" and {closes} "{CLOSE}" in the text: a turn holds one think '
                        f'block, "{OPEN}...{CLOSE}" at its start (the template keeps only the text before the '
                        f'first "{CLOSE}" and after the last)')
    if opens:
        at = text.index(OPEN)
        if at > text.index(CLOSE):
            raise BadSample(f'turn {i}: "{OPEN}" after "{CLOSE}" in the text: the think block must open the turn')
        if text[:at].strip():
            raise BadSample(f'turn {i}: text before "{OPEN}" ({_excerpt(text[:at].strip())}): the template drops '
                            "it; the think block must open the turn")
    return value


def check_rendered(messages: Sequence["Message"], template: str) -> None:
    """`reasoning_content` on a turn of a template that never reads it (Qwen2-VL's, Qwen3-VL's,
    ...) would be dropped without a word: a bad record naming the turn."""
    if "reasoning_content" in template:
        return
    for i, message in enumerate(messages):
        if message.reasoning is not None:
            raise BadSample(f'turn {i}: "reasoning_content" is given, but the model directory\'s chat template never '
                            "reads reasoning_content, so it would be dropped without a word: put the reasoning in the "
                            "turn's text, or leave it out")


def template_kwargs(enable_thinking: Optional[bool]) -> dict[str, bool]:
    """What `--enable-thinking` passes to every rendering of the chat template (nothing when not
    given: the template's own default)."""
    return {} if enable_thinking is None else {"enable_thinking": enable_thinking}


def check_template(processor: Processor, enable_thinking: Optional[bool]) -> None:
    """`--enable-thinking` on a template that never reads enable_thinking would change nothing."""
    if enable_thinking is None:
        return
    template = getattr(processor, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default")
    if not template or "enable_thinking" not in template:
        raise PrepareError(f"--enable-thinking {'on' if enable_thinking else 'off'}: the model directory's chat "
                           "template does not read enable_thinking, so the flag would change nothing; leave it out")


def _excerpt(text: str, n: int = 40) -> str:
    return f'"{text}"' if len(text) <= n else f'"{text[:n]}..."'


def _type(value: object) -> str:
    return {list: "a list", dict: "an object", bool: "a boolean", int: "a number", float: "a number"}.get(
        type(value), type(value).__name__)
