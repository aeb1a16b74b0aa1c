"""Tool calling over any chat template: the JSON schema of a call, tool_choice, and parsing calls out of text.

A call is the JSON object {"name": ..., "arguments": {...}}. With a required tool choice the
output is constrained to that schema, so even a small model emits a well-formed call; with
"auto" we parse it out of the text (bare, fenced or inside <tool_call> tags).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from inferplug.chat_template import profile_template
from inferplug.errors import RequestError


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")


def tool_names(tools: list[dict[str, Any]]) -> list[str]:
    return [t["function"]["name"] for t in tools]


def call_schema(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON schema of one call to any of `tools` (OpenAI tool dicts)."""
    options = []
    for tool in tools:
        fn = tool["function"]
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        options.append({
            "type": "object",
            "properties": {"name": {"type": "string", "enum": [fn["name"]]}, "arguments": params},
            "required": ["name", "arguments"],
        })
    return options[0] if len(options) == 1 else {"anyOf": options}


def select_tools(tools: list[dict[str, Any]], tool_choice: Any) -> tuple[list[dict[str, Any]], bool]:
    """(the tools the model may call, whether a call is required) for an OpenAI/LangChain tool_choice."""
    if tool_choice in (None, "auto"):
        return tools, False
    if tool_choice == "none":
        return [], False
    if tool_choice in ("any", "required", True):
        return tools, True
    name = tool_choice
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name") or tool_choice.get("name")
    chosen = [t for t in tools if t["function"]["name"] == name]
    if not chosen:
        raise RequestError(
            f"tool_choice names {name!r}, which is not among the bound tools {tool_names(tools)}; "
            "pass one of those names, 'auto', 'any' or 'none'",
            param="tool_choice",
        )
    return chosen, True


_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


def parse_tool_calls(text: str, tools: list[dict[str, Any]]) -> list[ToolCall]:
    """The calls to known tools in the model's text; [] when it answered in prose."""
    known = set(tool_names(tools))
    candidates = _TAGGED.findall(text) or [text]
    calls = []
    for candidate in candidates:
        for value in _json_values(candidate):
            for item in value if isinstance(value, list) else [value]:
                call = _as_call(item, known)
                if call is not None:
                    calls.append(call)
    return calls


def _json_values(text: str) -> list[Any]:
    """Every top-level JSON object or array in the text (fenced or bare)."""
    decoder, values, i = json.JSONDecoder(strict=False), [], 0
    while (i := _next_json_start(text, i)) >= 0:
        try:
            value, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            i += 1
            continue
        values.append(value)
        i = end
    return values


def _next_json_start(text: str, i: int) -> int:
    starts = [p for p in (text.find("{", i), text.find("[", i)) if p >= 0]
    return min(starts) if starts else -1


def _as_call(item: Any, known: set[str]) -> ToolCall | None:
    if not isinstance(item, dict) or item.get("name") not in known:
        return None
    args = item.get("arguments", item.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    return ToolCall(name=item["name"], arguments=args) if isinstance(args, dict) else None


def template_renders_tools(backend: Any) -> bool:
    """Whether the backend's chat template shows `tools` to the model (remote backends: assume yes)."""
    tokenizer = getattr(backend, "tokenizer", None)
    if tokenizer is None:
        return True
    template = profile_template(backend.profile) or tokenizer.chat_template
    return "tools" in str(template or "")


def with_tool_instructions(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For a template without tool support: describe the tools and the call format in the system message."""
    described = "\n".join(json.dumps(t["function"]) for t in tools)
    text = ("You can call these tools:\n" + described + "\nTo call one, reply with only a JSON object "
            '{"name": <tool name>, "arguments": {<argument>: <value>}}. Otherwise answer normally.')
    if messages and messages[0]["role"] == "system":
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]
