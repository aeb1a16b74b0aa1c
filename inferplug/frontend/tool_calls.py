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
from inferplug.types import ToolCallDelta


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")


def tool_names(tools: list[dict[str, Any]]) -> list[str]:
    return [t["function"]["name"] for t in tools]


def call_schema(tools: list[dict[str, Any]], parallel: bool = False) -> dict[str, Any]:
    """The JSON schema of one call to any of `tools` (OpenAI tool dicts); with `parallel`, of a non-empty
    array of calls (as vLLM constrains tool_choice="required" with parallel tool calls)."""
    options = []
    for tool in tools:
        fn = tool["function"]
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        options.append({
            "type": "object",
            "properties": {"name": {"type": "string", "enum": [fn["name"]]}, "arguments": params},
            "required": ["name", "arguments"],
        })
    one = options[0] if len(options) == 1 else {"anyOf": options}
    return {"type": "array", "items": one, "minItems": 1} if parallel else one


def select_tools(tools: list[dict[str, Any]], tool_choice: Any) -> tuple[list[dict[str, Any]], bool]:
    """(the tools the model may call, whether a call is required) for an OpenAI/LangChain tool_choice."""
    if tool_choice in (None, "auto"):
        return tools, False
    if tool_choice == "none":
        return [], False
    if tool_choice in ("any", "required", True):
        if not tools:
            raise RequestError(f"tool_choice={tool_choice!r} needs tools to call; pass tools or drop tool_choice",
                               param="tool_choice")
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


def calls_from_deltas(deltas: list[ToolCallDelta]) -> list[ToolCall]:
    """The whole calls a backend streamed in pieces, with the backend's ids; as with calls in text, one whose
    arguments are not a JSON object (cut by max_tokens) is no call."""
    merged: dict[int, list[Any]] = {}
    for delta in deltas:
        call = merged.setdefault(delta.index, [None, "", ""])
        call[0] = call[0] or delta.id
        call[1] += delta.name or ""
        call[2] += delta.arguments
    calls = []
    for call_id, name, arguments in merged.values():
        call = _as_call({"name": name, "arguments": arguments or "{}"}, {name})
        if call is not None:
            calls.append(ToolCall(call.name, call.arguments, call_id or call.id))
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
    """Whether the backend's chat template shows `tools` to the model (a backend that renders chats locally)."""
    template = profile_template(backend.profile) or backend.tokenizer.chat_template
    return "tools" in str(template or "")


def tool_history(messages: list[dict[str, Any]], offered: list[dict[str, Any]],
                 renders_tools: bool) -> list[dict[str, Any]]:
    """Messages ready for the chat template: an assistant turn's tool calls with their arguments as objects
    (templates serialize them), and for a template that knows no tools, the calls written into the turn's text
    (the format the instructions ask for), and the tools described in the system message."""
    prepared = [_template_message(m, renders_tools) for m in messages]
    return with_tool_instructions(prepared, offered) if offered and not renders_tools else prepared


def _template_message(message: dict[str, Any], renders_tools: bool) -> dict[str, Any]:
    calls = message.get("tool_calls")
    if message.get("content") is None:
        message = {**message, "content": ""}  # a template prints None as "None"
    if not calls:
        return message
    functions = [{"name": c["function"]["name"], "arguments": _arguments(c["function"].get("arguments"))}
                 for c in calls]
    if not renders_tools:  # the model sees its calls as the text it wrote (unless the turn already says so)
        written = json.dumps(functions[0] if len(functions) == 1 else functions)
        return {k: v for k, v in message.items() if k != "tool_calls"} | {"content": message["content"] or written}
    return {**message, "tool_calls": [{**c, "function": f} for c, f in zip(calls, functions)]}


def _arguments(value: Any) -> Any:
    """OpenAI sends a call's arguments as a JSON string; templates expect the object."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            raise RequestError(f"a tool call's arguments are not valid JSON: {value[:80]!r}; send the "
                               "arguments the model returned", param="messages") from None
    return value or {}


def with_tool_instructions(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For a template without tool support: describe the tools and the call format in the system message."""
    described = "\n".join(json.dumps(t["function"]) for t in tools)
    text = ("You can call these tools:\n" + described + "\nTo call one, reply with only a JSON object "
            '{"name": <tool name>, "arguments": {<argument>: <value>}}. Otherwise answer normally.')
    if messages and messages[0]["role"] == "system":
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]
