"""Which tokens are targets: the assistant turns' tokens, found in the chat template's output.

The released templates mostly have no `{% generation %}` markers (Qwen2-VL's, Qwen3-VL's,
InternVL's), so the assistant spans are found from the template itself, by rendering:

- a turn starts where the conversation up to it, rendered with the generation prompt, stops
  agreeing with the whole conversation rendered: what the model would be asked to write from
  there on is what it learns. For a thinking template (Qwen3.5's), whose generation prompt ends
  in `<think>\\n`, that is the reasoning, `</think>` and the answer of a turn the template renders
  with its think block; with `enable_thinking=False` the prompt holds an empty block;
- a turn the template renders with an empty think block (no reasoning) starts after the block
  with `--empty-think mask` (the default): the block is no target; with `train` the part of it
  past the generation prompt is (`\\n</think>\\n\\n`: the model learns to close the block at once);
- it ends after the template's end-of-turn marker (`<|im_end|>`), found once by rendering a
  probe conversation: the text that follows an assistant answer up to the next whitespace.
  A template with no such marker (LLaVA-1.5's) ends the turn where the conversation rendered up
  to it ends, which needs the turn to render the same whether or not it is last.

A template with `{% generation %}` markers is trusted instead: its marked spans are the targets
(less an empty think block with `--empty-think mask`).

Spans are character ranges of the rendered prompt; `token_mask` moves them past the processor's
placeholder expansion and marks every token that overlaps one.
"""
import bisect
import re
from typing import Any, Optional, cast

from .conversation import HFMessage
from .errors import BadSample, PrepareError
from .model import Processor

_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")

_PROBE_QUESTION = "mmsp probe question"
_PROBE_ANSWER = "mmsp probe answer"

# The think block a template writes for a turn without reasoning (Qwen3.5's "<think>\n\n</think>\n\n").
_EMPTY_THINK = re.compile(r"<think>\s*</think>\s*")

Span = tuple[int, int]  # characters [start, end)


class AssistantSpans:
    def __init__(self, processor: Processor, template_kwargs: Optional[dict[str, Any]] = None,
                 empty_think: str = "mask") -> None:
        self.processor = processor
        self.template_kwargs = template_kwargs or {}  # enable_thinking, for every rendering
        self.empty_think = empty_think
        template = processor.chat_template
        if isinstance(template, dict):
            template = template.get("default")
        if not template:
            raise PrepareError("the model directory's processor has no chat template (chat_template.jinja or "
                               "chat_template.json), so conversations cannot be rendered")
        self.template: str = template
        self.marked = bool(_GENERATION.search(template))
        self._closer: Optional[str] = None
        self._specials: Optional[list[str]] = None  # the tokenizer's special tokens, sorted

    def render(self, messages: list[HFMessage], add_generation_prompt: bool = False) -> str:
        try:
            return self.processor.apply_chat_template(messages, tokenize=False,
                                                      add_generation_prompt=add_generation_prompt,
                                                      **self.template_kwargs)
        except Exception as e:  # the template's raise_exception on a prefix of the conversation
            raise BadSample(f"the chat template refused the conversation's first {len(messages)} turns: "
                            f"{type(e).__name__}: {e}") from None

    @property
    def closer(self) -> str:
        """The template's end-of-turn marker after an assistant turn ('' if it has none)."""
        if self._closer is None:
            question = [{"role": "user", "content": [{"type": "text", "text": _PROBE_QUESTION}]}]
            answer = {"role": "assistant", "content": [{"type": "text", "text": _PROBE_ANSWER}]}
            try:
                prompt = self.render(question, add_generation_prompt=True)
                whole = self.render(question + [answer])
            except BadSample:  # a template that wants more than a question and an answer
                prompt = whole = ""
            tail = whole[_common_prefix(prompt, whole):]
            at = tail.find(_PROBE_ANSWER)
            rest = tail[at + len(_PROBE_ANSWER):].split() if at >= 0 else []
            self._closer = rest[0] if rest else ""
        return self._closer

    def check_special_tokens(self, messages: list[HFMessage]) -> None:
        """An assistant turn's text or reasoning holding a special token of the tokenizer
        (<|im_start|>, <|endoftext|>, a vision placeholder, the end-of-turn marker): the tokenizer
        reads it as that control token, which would be a target mid-turn. A bad record."""
        if self._specials is None:
            tokenizer = self.processor.tokenizer
            added = getattr(tokenizer, "added_tokens_decoder", {}).values()
            found = set(tokenizer.all_special_tokens) | {t.content for t in added if getattr(t, "special", False)}
            self._specials = sorted(t for t in found if t)
        closer = self.closer
        for k, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            texts = [("text", p.get("text", "")) for p in message["content"]]
            texts.append(("reasoning", message.get("reasoning_content") or ""))
            for where, t in texts:
                if closer and closer in t:
                    raise BadSample(f"turn {k} (assistant) contains the template's end-of-turn marker {closer}")
                token = next((s for s in self._specials if s in t), None)
                if token is not None:
                    raise BadSample(f"turn {k} (assistant): its {where} holds the special token {token}, which the "
                                    "tokenizer reads as that control token: it would be a target in the middle of a "
                                    "turn (the model would learn to write it); leave it out of the text")

    def spans(self, messages: list[HFMessage], text: str) -> list[Span]:
        """Character spans of `text` (the whole conversation rendered) that are assistant output."""
        spans = self._marked_spans(messages, text) if self.marked else self._rendered_spans(messages, text)
        if self.empty_think == "mask":
            spans = [(_past_empty_think(text, s, e), e) for s, e in spans]
        return [(s, e) for s, e in spans if e > s]

    def _marked_spans(self, messages: list[HFMessage], text: str) -> list[Span]:
        from transformers.utils.chat_template_utils import render_jinja_template

        # (transformers annotates it `-> str`; with return_assistant_tokens_mask it returns the renderings
        # and, per conversation, the generation spans.)
        rendered, indices = cast(tuple[list[str], list[list[Span]]], render_jinja_template(
            conversations=[messages], chat_template=self.template, return_assistant_tokens_mask=True,
            **self.processor.tokenizer.special_tokens_map, **self.template_kwargs))
        if rendered[0] != text:
            raise PrepareError("the chat template renders the same conversation differently twice")
        return [(s, e) for s, e in indices[0] if e > s]

    def _rendered_spans(self, messages: list[HFMessage], text: str) -> list[Span]:
        closer = self.closer
        spans: list[Span] = []
        floor = 1
        for k, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            prompt = self.render(messages[:k], add_generation_prompt=True)
            start = _common_prefix(prompt, text)
            if start < floor:
                raise BadSample(f"cannot find where assistant turn {k} starts in the chat template's output "
                                "(it renders the turns before it differently when they are followed by more)")
            if closer:
                end = text.find(closer, start)
                if end < 0:
                    raise BadSample(f"cannot find the end-of-turn marker {closer} after assistant turn {k} in "
                                    "the chat template's output")
                end += len(closer)
            else:
                upto = self.render(messages[:k + 1])
                if not text.startswith(upto):
                    raise BadSample(f"the chat template renders assistant turn {k} differently when it is not "
                                    "the last turn and has no end-of-turn marker, so its end cannot be found: "
                                    "add {% generation %} markers around assistant output in the template")
                end = len(upto.rstrip())
            spans.append((start, end))
            floor = end
        return spans


def token_mask(spans: list[Span], offsets: list[Span], replacements: list[dict[str, Any]], prompt: str) -> list[int]:
    """1 for every token of a span, else 0.

    `spans` are in the rendered `prompt`; `offsets` (each token's characters) are in the text the
    processor tokenized, where every vision placeholder was replaced by its expansion
    (`replacements`: transformers' `text_replacement_offsets`, in order). A token that lies
    partly outside a span is in it when it shares a non-blank character with it: Llama's "▁A"
    starts on the blank before an answer and is the answer's, but "▁USER" after a span that
    ends on a blank ("A cat. ", LLaVA's) is the next turn's."""
    shifts: list[tuple[int, int]] = []  # (position in the prompt, total growth of the text before it)
    growth = 0
    for r in replacements:
        growth += (r["new_span"][1] - r["new_span"][0]) - (r["span"][1] - r["span"][0])
        shifts.append((r["span"][1], growth))
    ends = [p for p, _ in shifts]

    def shift(x: int) -> int:
        i = bisect.bisect_right(ends, x)
        return shifts[i - 1][1] if i else 0

    # (start, end, growth) in the tokenized text; no placeholder is inside an assistant span.
    moved = sorted((s + shift(s), e + shift(s), shift(s)) for s, e in spans)
    mask = [0] * len(offsets)
    j = 0
    for i, (a, b) in enumerate(offsets):
        if b <= a:  # a token added by the tokenizer's post-processor (<s>): no characters
            continue
        while j < len(moved) and moved[j][1] <= a:
            j += 1
        if j == len(moved) or moved[j][0] >= b:
            continue
        s, e, g = moved[j]
        if s <= a and b <= e or prompt[max(a, s) - g:min(b, e) - g].strip():
            mask[i] = 1
    return mask


def _past_empty_think(text: str, start: int, end: int) -> int:
    """`start` moved past the empty think block it lies in (or opens), if any, but not past `end`."""
    at = text.rfind("<think>", 0, start + len("<think>"))
    if at >= 0:
        block = _EMPTY_THINK.match(text, at)
        if block and at <= start < block.end():
            return min(block.end(), end)
    return start


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    # Compare in blocks first: the prompts are long and mostly equal.
    step = 1024
    while i + step <= n and a[i:i + step] == b[i:i + step]:
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i
