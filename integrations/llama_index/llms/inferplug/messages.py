"""LlamaIndex ChatMessages -> the OpenAI-style message dicts our chat templates render."""

from __future__ import annotations

import json
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, MessageRole, TextBlock

from inferplug.errors import RequestError

_ROLES = {
    MessageRole.SYSTEM: "system", MessageRole.DEVELOPER: "system", MessageRole.USER: "user",
    MessageRole.ASSISTANT: "assistant", MessageRole.CHATBOT: "assistant", MessageRole.MODEL: "assistant",
    MessageRole.TOOL: "tool",
}


def to_chat_dicts(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    return [_to_dict(m) for m in messages]


def _to_dict(message: ChatMessage) -> dict[str, Any]:
    role = _ROLES.get(message.role)
    if role is None:
        raise RequestError(f"cannot render a message with role {message.role.value!r}: use system, user, "
                           "assistant or tool", param="messages")
    out: dict[str, Any] = {"role": role, "content": _text(message)}
    calls = message.additional_kwargs.get("tool_calls")
    if role == "assistant" and calls:
        out["tool_calls"] = calls
        # Templates without tool support render only content: show the model its own calls.
        out["content"] = out["content"] or json.dumps([c["function"] for c in calls])
    if role == "tool":
        out["tool_call_id"] = message.additional_kwargs.get("tool_call_id")
    return out


def _text(message: ChatMessage) -> str:
    parts = []
    for block in message.blocks:
        if not isinstance(block, TextBlock):
            raise RequestError(f"this model reads text only and cannot render a {type(block).__name__}; "
                               "send text content", param="messages")
        parts.append(block.text)
    return "".join(parts)
