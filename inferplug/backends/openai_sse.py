"""OpenAI streaming chunks (Server-Sent Events) -> our Events, for the remote backend.

The usage chunk arrives after every choice has finished, so the last finishing event is held
back and sent with the usage: the request's last event carries usage, as the protocol says.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from inferplug.types import Event, TokenLogprob, ToolCallDelta, Usage

# Token ids are not part of OpenAI's responses; logprob entries carry this id instead.
UNKNOWN_TOKEN_ID = -1


async def sse_data(lines: AsyncIterator[str]) -> AsyncIterator[dict[str, Any]]:
    """The JSON payload of each `data:` line, until `data: [DONE]`."""
    async for line in lines:
        if not line.startswith("data:"):
            continue  # blank separators, comments, event names
        data = line[5:].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)


def chunk_events(request_id: str, chunk: dict[str, Any]) -> list[Event]:
    """One chunk's events, one per choice it mentions (its usage is read separately). A chat delta's
    `reasoning_content` becomes Event.reasoning, its `tool_calls` Event.tool_calls (the server's ids kept)."""
    events = []
    for choice in chunk.get("choices") or []:
        delta, index = choice.get("delta"), choice.get("index", 0)
        text = (delta.get("content") or "") if delta is not None else (choice.get("text") or "")
        event = Event(request_id, index=index, text=text, finish_reason=choice.get("finish_reason"),
                      stop_reason=choice.get("stop_reason"))
        event.reasoning = (delta or {}).get("reasoning_content") or (delta or {}).get("reasoning") or ""
        event.tool_calls = [_call_delta(c) for c in (delta or {}).get("tool_calls") or []]
        event.logprobs = _logprobs(choice.get("logprobs"))
        events.append(event)
    return events


def _call_delta(raw: dict[str, Any]) -> ToolCallDelta:
    fn = raw.get("function") or {}
    return ToolCallDelta(raw.get("index", 0), raw.get("id"), fn.get("name"), fn.get("arguments") or "")


def chunk_usage(chunk: dict[str, Any]) -> Usage | None:
    usage = chunk.get("usage")
    if not usage:
        return None
    details = usage.get("prompt_tokens_details") or {}
    return Usage(usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0), details.get("cached_tokens") or 0)


def _logprobs(raw: dict[str, Any] | None) -> list[TokenLogprob] | None:
    if not raw:
        return None
    if "content" in raw:  # chat
        return [TokenLogprob(UNKNOWN_TOKEN_ID, e["token"], e["logprob"],
                             [(UNKNOWN_TOKEN_ID, t["token"], t["logprob"]) for t in e.get("top_logprobs") or []])
                for e in raw["content"] or []]
    tops = raw.get("top_logprobs") or [None] * len(raw.get("tokens", []))  # completions
    return [TokenLogprob(UNKNOWN_TOKEN_ID, token, logprob, [(UNKNOWN_TOKEN_ID, t, lp) for t, lp in (top or {}).items()])
            for token, logprob, top in zip(raw.get("tokens", []), raw.get("token_logprobs", []), tops)]


class FinishHolder:
    """Holds the latest finishing event so the request's usage can ride on it."""

    def __init__(self) -> None:
        self.held: Event | None = None

    def pass_through(self, event: Event) -> Event | None:
        """The event to send now (None while it is held)."""
        if event.finish_reason is None:
            return event
        previous, self.held = self.held, event
        return previous

    def release(self, usage: Usage | None) -> Event | None:
        event, self.held = self.held, None
        if event is not None:
            event.usage = usage
        return event
