"""A reasoning model's `<think>...</think>` text, split from its answer as vLLM's reasoning parsers do
(gpt-oss's harmony channels: stages/harmony.py; Gemma 4's channels: stages/gemma4_channels.py).

`deepseek_r1`: the chat template opens `<think>` in the prompt (DeepSeek-R1 and its Qwen/Llama distills),
so the output is reasoning until `</think>` (a leading `<think>` the model writes anyway is dropped), and an
output that never closes it is all reasoning. `qwen3`: reasoning only between an explicit `<think>` and
`</think>`. Splitting runs on the stream, so a tag cut across two deltas is held back, never shown.
"""

from __future__ import annotations

import re
from typing import Any

from inferplug.profile_schema import REASONING_PARSERS as PARSERS
from inferplug.types import ToolCallDelta

START, END = "<think>", "</think>"
THINK_PARSERS = tuple(p for p in PARSERS if p not in ("openai_gptoss", "gemma4"))  # they have their own modules
HARMONY_CHANNEL, GEMMA4_CHANNEL = "<|channel|>", "<|channel>"


class ReasoningSplitter:
    """One choice's text deltas in, (content, reasoning) deltas out."""

    reads_control_tokens = False  # <think> tags are plain added tokens

    def __init__(self, parser: str) -> None:
        if parser not in THINK_PARSERS:
            raise ValueError(f"unknown reasoning parser {parser!r}; use one of {list(THINK_PARSERS)} or 'none'")
        self.parser = parser
        self.in_reasoning = parser == "deepseek_r1"
        self._opened = False  # deepseek_r1: a leading <think> is dropped once
        self._held = ""

    def _watched(self) -> list[str]:
        if self.in_reasoning:
            return [END] if self._opened or self.parser == "qwen3" else [END, START]
        return [START] if self.parser == "qwen3" else []

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        """The (content, reasoning) this delta completes; `final` flushes what a tag prefix held back."""
        buf, self._held = self._held + text, ""
        out = {False: [], True: []}
        while buf:
            tags = self._watched()
            found = [(buf.find(t), t) for t in tags if t in buf]
            if not found:
                keep = 0 if final else partial_tag_suffix(buf, tags)
                out[self.in_reasoning].append(buf[: len(buf) - keep])
                self._held = buf[len(buf) - keep:]
                break
            at, tag = min(found)
            out[self.in_reasoning].append(buf[:at])
            buf = buf[at + len(tag):]
            if tag == START and self.in_reasoning:  # deepseek_r1's redundant opening tag
                self._opened = True
            else:
                self.in_reasoning = tag == START
                self._opened = True
        return "".join(out[False]), "".join(out[True])

    def take_calls(self) -> list[ToolCallDelta]:
        """Think tags carry no tool calls (the tool parser reads them from the content)."""
        return []


def partial_tag_suffix(text: str, tags: list[str]) -> int:
    """The length of the longest end of `text` that could begin one of `tags`."""
    return max((n for tag in tags for n in range(1, len(tag)) if text.endswith(tag[:n])), default=0)


def split_reasoning(text: str, parser: str) -> tuple[str, str]:
    """(content, reasoning) of a whole output."""
    return ReasoningSplitter(parser).feed(text, final=True)


def detect_parser(template: Any, generation_prompt: str) -> str | None:
    """The parser a chat template implies: openai_gptoss for a harmony template (gpt-oss's channels), gemma4 for
    Gemma 4's channels, none without `</think>`, deepseek_r1 when the rendered assistant turn already opens
    `<think>`, else qwen3."""
    if HARMONY_CHANNEL in str(template or ""):
        return "openai_gptoss"
    if GEMMA4_CHANNEL in str(template or ""):
        return "gemma4"
    if END not in str(template or ""):
        return None
    return "deepseek_r1" if re.search(re.escape(START) + r"\s*$", generation_prompt) else "qwen3"
