"""A required or named tool choice's answer as tool calls, whole or cut short, at once or as it streams.

The answer is constrained to `call_schema` (tool_calls.py): `{"name": ..., "arguments": {...}}`, or an array of
them with parallel calls. OpenAI and vLLM answer such a choice in `tool_calls` always: a generation cut by
max_tokens (or a stop string) still comes back as the call, with the partial text as its `arguments` and
finish_reason "length", so a client that reads tool_calls never sees the call as prose.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from inferplug.frontend.tool_calls import ToolCall, as_call, tool_names
from inferplug.types import ToolCallDelta

# the grammar puts the name first (names are [a-zA-Z0-9_-], as OpenAI requires: no escapes to decode)
_NAME = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"]*)(")?')
_ARGUMENTS = re.compile(r'\s*,\s*"arguments"\s*:\s*(?=\S)')  # up to the arguments' first character
_BETWEEN_CALLS = re.compile(r"[\s,\[]*")  # an array's opening bracket, the commas and whitespace between calls
_DECODER = json.JSONDecoder(strict=False)
# the head `{"name": "<name>", "arguments": ` is short (a name has at most 64 characters): looking for it in a
# longer text (only whitespace could make one) would make a stream quadratic in its length
_LONGEST_HEAD = 256


def forced_calls(text: str, tools: list[dict[str, Any]], parallel: bool) -> list[ToolCall]:
    """The calls in a required choice's whole answer, never none: each whole call parsed, then the call the
    generation cut short (if it was), with its partial arguments text."""
    known, calls, i = set(tool_names(tools)), [], 0
    while not calls or parallel:
        i = _BETWEEN_CALLS.match(text, i).end()
        if not text.startswith("{", i):
            break
        try:
            item, end = _DECODER.raw_decode(text, i)
        except (json.JSONDecodeError, RecursionError):  # cut short: the rest of the text is this call's start
            calls.append(cut_call(text[i:], tools))
            break
        calls.append(as_call(item, known) or cut_call(text[i:end], tools))
        i = end
    return calls or [cut_call("", tools)]


def cut_call(text: str, tools: list[dict[str, Any]]) -> ToolCall:
    """The call a cut text (one call object's start) begins: its name, completed from the offered tools when the
    cut fell inside it (the first offered tool it may still be), and its arguments text so far."""
    name, arguments = _parts(text)
    if name is None:
        start = _NAME.match(text)
        prefix = start.group(1) if start else ""
        name = next((n for n in tool_names(tools) if n.startswith(prefix)), tool_names(tools)[0])
    try:
        value = json.loads(arguments or "null")
    except (json.JSONDecodeError, RecursionError):
        value = None
    if isinstance(value, dict):  # only the call's closing brace was cut: the arguments are whole
        return ToolCall(name, value)
    return ToolCall(name, {}, partial=arguments)


def _parts(text: str) -> tuple[str | None, str]:
    """(the call's name once it is whole, else None; the text of its arguments so far)."""
    start = _NAME.match(text)
    if start is None or start.group(2) is None:
        return None, ""
    arguments = _ARGUMENTS.match(text, start.end())
    return start.group(1), text[arguments.end():] if arguments else ""


class ForcedCallStream:
    """One required call (no parallel calls) streamed as OpenAI streams it: a first piece with the call's id and
    name once the name is out, then the arguments as they are decoded (the closing brace held back)."""

    def __init__(self, tools: list[dict[str, Any]]) -> None:
        self.tools, self.text = tools, ""
        self.id = f"call_{uuid.uuid4().hex[:24]}"
        self._arguments_from: int | None = None  # where the arguments start in `text`
        self._sent = 0  # how far into `text` the arguments were sent
        self.cut = False  # known at finish: the call was cut short

    def feed(self, text: str) -> list[ToolCallDelta]:
        self.text += text
        pieces = []
        if self._arguments_from is None:
            if len(self.text) > _LONGEST_HEAD:  # no head yet: none will come (the rest waits for finish)
                return []
            head = _NAME.match(self.text)
            arguments = _ARGUMENTS.match(self.text, head.end()) if head and head.group(2) else None
            if arguments is None:
                return []
            self._arguments_from = self._sent = arguments.end()
            pieces.append(self._first(head.group(1)))
        end = len(self.text) - 1  # the last character may be the call's closing brace
        return pieces + self._arguments_until(end)

    def finish(self) -> list[ToolCallDelta]:
        """The rest once the answer is complete: the call's end, or, cut short, all the text there is."""
        if self._arguments_from is None:  # cut before its arguments began
            self.cut = True
            return [self._first(cut_call(self.text, self.tools).name)]
        try:
            _, end = _DECODER.raw_decode(self.text, self._arguments_from)  # whole arguments: a whole call
        except (json.JSONDecodeError, RecursionError):
            self.cut, end = True, len(self.text)
        return self._arguments_until(end)

    def _first(self, name: str) -> ToolCallDelta:
        return ToolCallDelta(index=0, id=self.id, name=name)

    def _arguments_until(self, end: int) -> list[ToolCallDelta]:
        if end <= self._sent:
            return []
        piece, self._sent = self.text[self._sent:end], end
        return [ToolCallDelta(index=0, arguments=piece)]
