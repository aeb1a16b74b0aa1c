"""LangChain messages <-> the OpenAI-style message dicts our chat templates render."""

from __future__ import annotations

import json
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

from inferplug.errors import RequestError

_ROLES = {"system", "user", "assistant", "tool"}


def chat_dict(message: BaseMessage) -> dict[str, Any]:
    """One LangChain message as the OpenAI-style dict a chat template renders; RequestError for one it cannot."""
    content = message.content if isinstance(message.content, str) else _text(message.content)
    if isinstance(message, SystemMessage):
        return {"role": "system", "content": content}
    if isinstance(message, HumanMessage):
        return {"role": "user", "content": content}
    if isinstance(message, AIMessage):
        out: dict[str, Any] = {"role": "assistant", "content": content}
        if message.tool_calls:
            calls = [{"name": c["name"], "arguments": c["args"]} for c in message.tool_calls]
            out["tool_calls"] = [
                {"id": c.get("id"), "type": "function",
                 "function": {"name": c["name"], "arguments": json.dumps(c["args"])}}
                for c in message.tool_calls
            ]
            # Templates without tool support render only content: show the model its own calls.
            out["content"] = content or json.dumps(calls[0] if len(calls) == 1 else calls)
        return out
    if isinstance(message, ToolMessage):
        return {"role": "tool", "content": content, "tool_call_id": message.tool_call_id}
    if isinstance(message, ChatMessage) and message.role in _ROLES:
        return {"role": message.role, "content": content}
    raise RequestError(
        f"cannot render a {type(message).__name__}"
        + (f" with role {message.role!r}" if isinstance(message, ChatMessage) else "")
        + ": use SystemMessage, HumanMessage, AIMessage or ToolMessage",
        param="messages",
    )


def _text(blocks: list[Any]) -> str:
    """The text of a message's content blocks."""
    parts = []
    for block in blocks:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text":
            parts.append(block.get("text", ""))
        elif isinstance(block, dict) and block.get("type") in ("tool_use", "tool_call"):
            continue  # carried by message.tool_calls
        else:
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            raise RequestError(
                f"this model reads text only and cannot render a {kind!r} content block; "
                "send text content",
                param="messages",
            )
    return "".join(parts)
