"""Streaming with tools bound: text deltas in, content deltas or LangChain tool-call chunks out.

A required call streams as its name and then its arguments are decoded, cut short or not
(frontend/forced_call.py). With `auto` the model may answer in prose: text that opens like a call (`{`, `[`,
`<tool_call>`, a code fence) is held and parsed at the end; anything else streams as content at once.
"""

from __future__ import annotations

from typing import Any

from inferplug.frontend.forced_call import ForcedCallStream
from inferplug.frontend.tool_calls import parse_tool_calls
from inferplug.types import ToolCallDelta

_CALL_OPENERS = ("{", "[", "<", "`")


class ToolCallStream:
    def __init__(self, tools: list[dict[str, Any]], required: bool) -> None:
        self.tools = tools
        self.mode = "undecided"  # with "auto": then "text" or "held"
        self.text = ""
        self.forced = ForcedCallStream(tools) if required else None
        self.called = False  # known at finish: the answer is whole calls

    def feed(self, delta: str) -> tuple[str, list[dict[str, Any]]]:
        """(content to stream, tool-call chunks to stream) for one text delta."""
        if self.forced is not None:
            return "", [call_chunk(d) for d in self.forced.feed(delta)]
        self.text += delta
        if self.mode == "undecided" and self.text.strip():
            self.mode = "held" if self.text.lstrip().startswith(_CALL_OPENERS) else "text"
            delta = self.text if self.mode == "text" else ""
        return (delta, []) if self.mode == "text" else ("", [])

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """What is still held once the text is complete."""
        if self.forced is not None:
            pieces = [call_chunk(d) for d in self.forced.finish()]
            self.called = not self.forced.cut
            return "", pieces
        if self.mode != "held":
            return "", []
        calls = parse_tool_calls(self.text, self.tools)
        if not calls:
            return self.text, []
        self.called = True
        return "", [call_chunk(ToolCallDelta(i, c.id, c.name, c.arguments_json())) for i, c in enumerate(calls)]


def call_chunk(delta: ToolCallDelta) -> dict[str, Any]:
    """A piece of a call as LangChain's tool-call chunk (the first piece of each call brings its id and name)."""
    return {"type": "tool_call_chunk", "index": delta.index, "id": delta.id, "name": delta.name,
            "args": delta.arguments}
