"""A chat choice's text when tools are offered: held back while it may still become a tool call, then either
released as content or turned into OpenAI `tool_calls` once the choice ends (streamed or whole, one rule).

With "auto", a call is recognised as vLLM's parsers do at the start of the answer: a JSON object or array, fenced
or bare, or <tool_call> tags; an answer that starts as prose is prose, streamed as it comes, up to a <tool_call> tag
(Qwen's models often write a sentence first): the calls from there on are calls, the prose before them content, as
vLLM's hermes parser splits them. A required or named
choice answers in tool_calls always, cut short or not (frontend/forced_call.py): one call streams its arguments
as they are decoded, an array of parallel calls is sent once the choice ends.
"""

from __future__ import annotations

from typing import Any

from inferplug.frontend.forced_call import ForcedCallStream, forced_calls
from inferplug.frontend.tool_calls import CALL_OPEN, ToolCall, all_whole, parse_tool_calls
from inferplug.types import ToolCallDelta

_CALL_STARTS = ("{", "[", CALL_OPEN, "```")
_LONGEST_START = max(map(len, _CALL_STARTS))


def _may_be_call(start: str) -> bool:
    """Whether an answer whose first characters (after whitespace) are `start` may be a call."""
    return any(start.startswith(m) or m.startswith(start) for m in _CALL_STARTS)


class ToolCallText:
    def __init__(self, tools: list[dict[str, Any]], parallel: bool, required: bool) -> None:
        self.tools, self.parallel, self.required = tools, parallel, required
        self.forced = ForcedCallStream(tools) if required and not parallel else None
        self.held = ""
        self.start = ""  # the held text's first characters after whitespace: all that decides (linear in the text)
        self.prose = False  # the answer started as text: sent as it comes, up to a <tool_call> tag
        self.tag = False  # a <tool_call> tag came after the prose: all from it on is held
        self.called = False  # some call piece was sent
        self.cut = False  # known at finish: a call was cut short

    def split(self, text: str) -> tuple[str, list[ToolCall]]:
        """A whole answer's (content, calls): all content without calls, none beside calls it starts with, the
        prose before the first <tool_call> tag beside the calls from there on."""
        if self.required:
            return "", forced_calls(text, self.tools, self.parallel)
        at = 0 if _may_be_call(text.lstrip()[:_LONGEST_START]) else text.find(CALL_OPEN)
        calls = parse_tool_calls(text[at:], self.tools) if at >= 0 else []
        calls = calls if self.parallel else calls[:1]
        return (text[:at], calls) if calls else (text, [])

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        """(the content to send now, the call pieces to send now) for the choice's new text."""
        if self.forced is not None:
            return "", self._sent(self.forced.feed(text))
        if self.prose:
            return self._prose(text), []
        self.held += text
        if len(self.start) < _LONGEST_START:
            self.start = (self.start + text).lstrip()[:_LONGEST_START]
        if self.required or _may_be_call(self.start):
            return "", []
        self.prose, held, self.held = True, self.held, ""
        return self._prose(held), []

    def _prose(self, text: str) -> str:
        """The prose to send now: up to a <tool_call> tag, after which all is held, less an end that may begin
        one."""
        if self.tag:
            self.held += text
            return ""
        text, self.held = self.held + text, ""
        at = text.find(CALL_OPEN)
        if at >= 0:
            self.tag, self.held = True, text[at:]
            return text[:at]
        keep = next((n for n in range(min(len(text), len(CALL_OPEN) - 1), 0, -1)
                     if CALL_OPEN.startswith(text[-n:])), 0)
        self.held = text[len(text) - keep:]
        return text[:len(text) - keep]

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        """(content still held, the call pieces still to send) when the choice ends: the text as split() splits it."""
        if self.forced is not None:
            pieces = self._sent(self.forced.finish())
            self.cut = self.forced.cut
            return (self.forced.text if self.forced.prose else ""), pieces
        _, calls = self.split(self.held) if not self.prose or self.tag else ("", [])
        self.cut = bool(calls) and not all_whole(calls)
        if calls:
            return "", self._sent([ToolCallDelta(i, c.id, c.name, c.arguments_json()) for i, c in enumerate(calls)])
        released, self.held = self.held, ""
        return released, []

    def _sent(self, pieces: list[ToolCallDelta]) -> list[ToolCallDelta]:
        self.called |= bool(pieces)
        return pieces


def tool_calls_json(calls: list[ToolCall]) -> list[dict[str, Any]]:
    """A whole message's tool_calls, in OpenAI's shape: the arguments as a JSON string (partial when cut short)."""
    return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments_json()}}
            for c in calls]


def call_delta_json(delta: ToolCallDelta) -> dict[str, Any]:
    """A streamed piece of a call, in OpenAI's shape: the first piece of each call brings its id and name."""
    function = {"arguments": delta.arguments} | ({"name": delta.name} if delta.name else {})
    return {"index": delta.index, "function": function} | ({"id": delta.id, "type": "function"} if delta.id else {})
