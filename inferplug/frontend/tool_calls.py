"""Tool calling over any chat template: the JSON schema of a call, tool_choice, and parsing calls out of text.

A call is the JSON object {"name": ..., "arguments": {...}}. With a required tool choice the
output is constrained to that schema, so even a small model emits a well-formed call; with
"auto" we parse it out of the text (bare, fenced or inside <tool_call> tags), or in Qwen3-Coder's and Qwen3.5's
XML form inside the tags (vLLM's qwen3_coder parser's).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from inferplug.chat_template import chat_template_text
from inferplug.errors import RequestError
from inferplug.types import ToolCallDelta


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")
    partial: str | None = None  # a call cut short (max_tokens): its arguments text so far, which is not JSON yet

    def arguments_json(self) -> str:
        """The arguments as OpenAI sends them: a JSON string, or the partial text of a call cut short."""
        return self.partial if self.partial is not None else json.dumps(self.arguments, ensure_ascii=False)


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
            "pass one of those names, 'auto', 'required' (LangChain's 'any') or 'none'",
            param="tool_choice",
        )
    return chosen, True


CALL_OPEN, _CLOSE = "<tool_call>", "</tool_call>"  # Qwen's (hermes) call tags
_JSON_START = re.compile(r"[\[{]")
_OPENS_RUN = re.compile(r"[\[{\s]*")
# Failed JSON starts tried per text: each may scan to the end, so a bound keeps hostile or looping output (an
# unclosed object, then megabytes of spaces or braces) linear in its length.
MAX_FAILED_STARTS = 32


def parse_tool_calls(text: str, tools: list[dict[str, Any]]) -> list[ToolCall]:
    """The calls to known tools in the model's text; [] when it answered in prose. Linear in the text's length."""
    known = set(tool_names(tools))
    candidates = _tagged(text) or [text]
    calls = []
    for candidate in candidates:
        if _FUNCTION in candidate:
            calls += _xml_calls(candidate, tools)
            continue
        for value in _json_values(candidate):
            for item in value if isinstance(value, list) else [value]:
                call = as_call(item, known)
                if call is not None:
                    calls.append(call)
    return calls


def _tagged(text: str) -> list[str]:
    """The text inside each <tool_call> tag, up to its </tool_call> (or the end of the text), stripped."""
    found, i = [], text.find(CALL_OPEN)
    while i >= 0:
        start = i + len(CALL_OPEN)
        end = text.find(_CLOSE, start)
        found.append(text[start:end if end >= 0 else len(text)].strip())
        i = text.find(CALL_OPEN, end + len(_CLOSE)) if end >= 0 else -1
    return found


_FUNCTION, _END_FUNCTION, _PARAMETER, _END_PARAMETER = "<function=", "</function>", "<parameter=", "</parameter>"


def _xml_calls(text: str, tools: list[dict[str, Any]]) -> list[ToolCall]:
    """Qwen3-Coder's and Qwen3.5's calls: <function=NAME>, a <parameter=KEY> VALUE </parameter> for each argument,
    </function>. A value is its text where the tool's schema says string (or nothing), else its JSON (a number,
    a boolean, an object), as vLLM's qwen3_coder parser reads it. A call without its </function> (cut short) is
    none. Linear in the text's length."""
    schemas = {t["function"]["name"]: (t["function"].get("parameters") or {}).get("properties") or {} for t in tools}
    calls, i = [], text.find(_FUNCTION)
    while i >= 0 and (head := text.find(">", i)) >= 0 and (end := text.find(_END_FUNCTION, head)) >= 0:
        name = text[i + len(_FUNCTION):head].strip()
        if name in schemas:
            calls.append(ToolCall(name=name, arguments=_xml_arguments(text[head + 1:end], schemas[name])))
        i = text.find(_FUNCTION, end)
    return calls


def _xml_arguments(body: str, properties: dict[str, Any]) -> dict[str, Any]:
    arguments, i = {}, body.find(_PARAMETER)
    while i >= 0 and (head := body.find(">", i)) >= 0:
        nxt = body.find(_PARAMETER, head)
        bound = nxt if nxt >= 0 else len(body)  # an unclosed one ends where the next starts
        end = body.find(_END_PARAMETER, head, bound)
        stop = end if end >= 0 else bound
        key, value = body[i + len(_PARAMETER):head].strip(), body[head + 1:stop]
        value = value.removeprefix("\n").removesuffix("\n")
        arguments[key] = _xml_value(value, (properties.get(key) or {}).get("type"))
        i = nxt
    return arguments


def _xml_value(text: str, kind: Any) -> Any:
    if kind in (None, "string"):
        return text
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return text


def calls_from_deltas(deltas: list[ToolCallDelta]) -> list[ToolCall]:
    """The calls a backend streamed in pieces, with the backend's ids; one whose arguments are not a JSON object
    (cut by max_tokens) is kept with its partial arguments text, as OpenAI returns it."""
    merged: dict[int, list[Any]] = {}
    for delta in deltas:
        call = merged.setdefault(delta.index, [None, "", ""])
        call[0] = call[0] or delta.id
        call[1] += delta.name or ""
        call[2] += delta.arguments
    calls = []
    for call_id, name, arguments in merged.values():
        call = (as_call({"name": name, "arguments": arguments or "{}"}, {name})
                or ToolCall(name, {}, partial=arguments))
        if name:
            calls.append(ToolCall(call.name, call.arguments, call_id or call.id, call.partial))
    return calls


def finish_with_calls(finish_reason: str | None, called: bool) -> str | None:
    """A choice that ended by itself with whole tool calls (`called`) finishes with "tool_calls", as OpenAI's do;
    one whose call was cut short keeps its reason ("length" at max_tokens, "stop" at a stop string)."""
    return "tool_calls" if called and finish_reason == "stop" else finish_reason


def all_whole(calls: list[ToolCall]) -> bool:
    """Whether the answer is calls and none of them was cut short."""
    return bool(calls) and all(c.partial is None for c in calls)


def _json_values(text: str) -> list[Any]:
    """Every top-level JSON object or array in the text (fenced or bare). A value nested too deep to decode
    (`[[[[...`) is no value, as an unclosed one is."""
    decoder, values, failed, i = json.JSONDecoder(strict=False), [], 0, 0
    while failed < MAX_FAILED_STARTS and (start := _JSON_START.search(text, i)) is not None:
        try:
            value, i = decoder.raw_decode(text, start.start())
        except json.JSONDecodeError:
            failed, i = failed + 1, start.start() + 1
            continue
        except RecursionError:  # the starts in this run of brackets are as deep: try its innermost one next
            failed, i = failed + 1, _OPENS_RUN.match(text, start.start()).end() - 1
            continue
        values.append(value)
    return values


def as_call(item: Any, known: set[str]) -> ToolCall | None:
    """A decoded JSON value as a whole call to one of the `known` tools, or None."""
    if not isinstance(item, dict) or item.get("name") not in known:
        return None
    args = item.get("arguments", item.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except (json.JSONDecodeError, RecursionError):
            return None
    return ToolCall(name=item["name"], arguments=args) if isinstance(args, dict) else None


def template_renders_tools(backend: Any) -> bool:
    """Whether the backend's chat template shows `tools` to the model (a backend that renders chats locally)."""
    return "tools" in str(chat_template_text(backend.profile, backend.tokenizer) or "")


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
    functions = [_history_call(c) for c in _call_list(calls)]
    if not renders_tools:  # the model sees its calls as the text it wrote (unless the turn already says so)
        written = json.dumps(functions[0] if len(functions) == 1 else functions)
        return {k: v for k, v in message.items() if k != "tool_calls"} | {"content": message["content"] or written}
    return {**message, "tool_calls": [{**c, "function": f} for c, f in zip(calls, functions)]}


_CALL_SHAPE = ("send each as {'id': ..., 'type': 'function', 'function': {'name': <str>, 'arguments': <JSON "
               "object as a string>}}, as the model returned it")


def _call_list(calls: Any) -> list[dict[str, Any]]:
    if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
        raise RequestError(f"an assistant message's tool_calls is not a list of calls: {_CALL_SHAPE}",
                           param="messages")
    return calls


def _history_call(call: dict[str, Any]) -> dict[str, Any]:
    """One call of an assistant turn in the history, checked: its name, and its arguments as an object (or the
    text of a call cut short)."""
    function = call.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise RequestError(f"a tool call in the history has no function name: {_CALL_SHAPE}", param="messages")
    return {"name": function["name"], "arguments": _arguments(function.get("arguments"))}


def _arguments(value: Any) -> dict[str, Any] | str:
    """OpenAI sends a call's arguments as a JSON string; templates expect the object. A string that is not JSON
    is a call cut short (as a required choice's answer returns one): the template gets that text as it is."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (json.JSONDecodeError, RecursionError):
            return value
    value = value or {}
    if not isinstance(value, dict):
        raise RequestError(f"a tool call's arguments are not a JSON object: {_CALL_SHAPE}", param="messages")
    return value


def with_tool_instructions(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For a template without tool support: describe the tools and the call format in the system message."""
    described = "\n".join(json.dumps(t["function"]) for t in tools)
    text = ("You can call these tools:\n" + described + "\nTo call one, reply with only a JSON object "
            '{"name": <tool name>, "arguments": {<argument>: <value>}}. Otherwise answer normally.')
    if messages and messages[0]["role"] == "system":
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]
