"""A chat choice's text when tools are offered: held back while it may still become a tool call, then either
released as content or turned into OpenAI `tool_calls` once the choice ends (streamed or whole, one rule).

A call is recognised as vLLM's parsers do at the start of the answer: a JSON object or array, fenced or
bare, or <tool_call> tags. An answer that starts as prose is prose, streamed as it comes.
"""

from __future__ import annotations

import json
from typing import Any

from inferplug.frontend.tool_calls import ToolCall, parse_tool_calls

_CALL_STARTS = ("{", "[", "<tool_call>", "```")
_LONGEST_START = max(map(len, _CALL_STARTS))


def _may_be_call(start: str) -> bool:
    """Whether an answer whose first characters (after whitespace) are `start` may be a call."""
    return any(start.startswith(m) or m.startswith(start) for m in _CALL_STARTS)


class ToolCallText:
    def __init__(self, tools: list[dict[str, Any]], parallel: bool) -> None:
        self.tools, self.parallel = tools, parallel
        self.held = ""
        self.start = ""  # the held text's first characters after whitespace: all that decides (linear in the text)
        self.prose = False  # the answer started as text: nothing more is held

    def feed(self, text: str) -> str:
        """The content to send now for the choice's new text."""
        if self.prose:
            return text
        self.held += text
        if len(self.start) < _LONGEST_START:
            self.start = (self.start + text).lstrip()[:_LONGEST_START]
        if _may_be_call(self.start):
            return ""
        self.prose, released, self.held = True, self.held, ""
        return released

    def finish(self) -> tuple[str, list[ToolCall]]:
        """(content still held, the calls) when the choice ends: either calls or the held text, never both."""
        calls = [] if self.prose else parse_tool_calls(self.held, self.tools)
        if calls:
            return "", calls if self.parallel else calls[:1]
        released, self.held = self.held, ""
        return released, []


def tool_calls_json(calls: list[ToolCall], streamed: bool) -> list[dict[str, Any]]:
    """OpenAI's tool_calls: arguments as a JSON string; a streamed delta numbers its calls."""
    out = []
    for i, call in enumerate(calls):
        entry = {"id": call.id, "type": "function",
                 "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)}}
        out.append({"index": i, **entry} if streamed else entry)
    return out
