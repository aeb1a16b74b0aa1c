"""Streaming with tools bound: text deltas in, content deltas or LangChain tool-call chunks out.

A required call is constrained to `{"name": "...", "arguments": {...}}` with fixed separators, so once
its name is out the arguments stream as they are decoded (the outer closing brace held back). With
`auto` the model may answer in prose: text that opens like a call (`{`, `[`, `<tool_call>`, a code
fence) is held and parsed at the end; anything else streams as content at once.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from inferplug.frontend.tool_calls import parse_tool_calls

_CALL_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')
_CALL_OPENERS = ("{", "[", "<", "`")


class ToolCallStream:
    def __init__(self, tools: list[dict[str, Any]], required: bool) -> None:
        self.tools = tools
        self.mode = "call" if required else "undecided"  # then "text" or "held"
        self.text = ""
        self._args_from: int | None = None  # where a forced call's arguments start in `text`
        self._args_sent = 0
        self._id = f"call_{uuid.uuid4().hex[:24]}"

    def feed(self, delta: str) -> tuple[str, list[dict[str, Any]]]:
        """(content to stream, tool-call chunks to stream) for one text delta."""
        self.text += delta
        if self.mode == "undecided" and self.text.strip():
            self.mode = "held" if self.text.lstrip().startswith(_CALL_OPENERS) else "text"
            delta = self.text if self.mode == "text" else ""
        if self.mode == "text":
            return delta, []
        if self.mode == "call":
            return "", self._forced_call(final=False)
        return "", []

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """What is still held once the text is complete."""
        if self.mode == "call":
            return "", self._forced_call(final=True)
        if self.mode != "held":
            return "", []
        calls = parse_tool_calls(self.text, self.tools)
        if not calls:
            return self.text, []
        return "", [_chunk(i, c.id, c.name, json.dumps(c.arguments)) for i, c in enumerate(calls)]

    def _forced_call(self, final: bool) -> list[dict[str, Any]]:
        chunks = []
        if self._args_from is None:
            head = _CALL_HEAD.match(self.text)
            if head is None:
                return []
            self._args_from = self._args_sent = head.end()
            chunks.append(_chunk(0, self._id, json.loads(f'"{head.group(1)}"'), ""))
        end = len(self.text) - (1 if final and self.text.endswith("}") else 0 if final else 1)
        if end > self._args_sent:
            chunks.append(_chunk(0, None, None, self.text[self._args_sent:end]))
            self._args_sent = end
        return chunks


def _chunk(index: int, call_id: str | None, name: str | None, args: str) -> dict[str, Any]:
    return {"type": "tool_call_chunk", "index": index, "id": call_id, "name": name, "args": args}
