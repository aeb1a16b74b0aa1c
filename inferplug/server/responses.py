"""Backend Events -> OpenAI response objects: whole responses, stream chunks, usage, logprobs."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from inferplug.types import Event, TokenLogprob, Usage

Kind = Literal["chat", "completion"]
# OpenAI's finish_reason has no value for an aborted choice, and strict clients reject unknown ones: an
# abort reads "stop" to the client, and `ResponseBuilder.aborted` lets the server's metrics count it apart
_FINISH = {"stop": "stop", "length": "length", "tool_calls": "tool_calls", "abort": "stop"}


def usage_json(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def _reasoning(text: str) -> dict[str, str]:
    return {"reasoning_content": text} if text else {}


def _token_bytes(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def chat_logprobs(entries: list[TokenLogprob]) -> dict[str, Any]:
    return {"content": [
        {"token": e.token, "logprob": e.logprob, "bytes": _token_bytes(e.token),
         "top_logprobs": [{"token": t, "logprob": lp, "bytes": _token_bytes(t)} for _, t, lp in e.top]}
        for e in entries
    ]}


def completion_logprobs(entries: list[TokenLogprob], text_offset: int) -> dict[str, Any]:
    offsets = []
    for e in entries:
        offsets.append(text_offset)
        text_offset += len(e.token)
    return {
        "tokens": [e.token for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [{t: lp for _, t, lp in e.top} for e in entries],
        "text_offset": offsets,
    }


@dataclass
class ChoiceState:
    text: str = ""
    reasoning: str = ""  # a reasoning model's think text: `reasoning_content`, as vLLM's reasoning parsers send it
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    started: bool = False  # a chat stream sends the role once, in the first chunk


class ResponseBuilder:
    """Builds one call's responses from its events, for /v1/chat/completions or /v1/completions."""

    def __init__(self, kind: Kind, model: str, num_choices: int, want_logprobs: bool):
        self.kind = kind
        self.model = model
        self.want_logprobs = want_logprobs
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.choices = [ChoiceState() for _ in range(num_choices)]
        self.aborted = False  # some choice was aborted by the backend, not finished

    def add(self, event: Event) -> ChoiceState:
        choice = self.choices[event.index]
        choice.text += event.text
        choice.reasoning += event.reasoning
        choice.logprobs.extend(event.logprobs or [])
        if event.finish_reason is not None:
            self.aborted |= event.finish_reason == "abort"
            choice.finish_reason = _FINISH.get(event.finish_reason, event.finish_reason)
            choice.stop_reason = event.stop_reason
        return choice

    # --- whole response -----------------------------------------------------------
    def response(self, usage: Usage) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion" if self.kind == "chat" else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [self._choice(i, c) for i, c in enumerate(self.choices)],
            "usage": usage_json(usage),
        }

    def _choice(self, index: int, c: ChoiceState) -> dict[str, Any]:
        if self.kind == "chat":
            logprobs = chat_logprobs(c.logprobs) if self.want_logprobs else None
            message = {"role": "assistant", "content": c.text, **_reasoning(c.reasoning)}
            return {"index": index, "message": message, "logprobs": logprobs,
                    "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
        logprobs = completion_logprobs(c.logprobs, 0) if self.want_logprobs else None
        return {"index": index, "text": c.text, "logprobs": logprobs, "finish_reason": c.finish_reason,
                "stop_reason": c.stop_reason}

    # --- stream chunks ------------------------------------------------------------
    def chunk(self, event: Event, include_usage: bool) -> dict[str, Any] | None:
        """The chunk for one event, or None when it carries nothing to send."""
        choice = self.choices[event.index]
        offset = len(choice.text)
        first = not choice.started
        self.add(event)
        choice.started = True
        if not (event.text or event.reasoning or event.finish_reason or first or (self.want_logprobs and event.logprobs)):
            return None
        finish = choice.finish_reason if event.finish_reason else None
        if self.kind == "chat":
            delta: dict[str, Any] = {"role": "assistant", "content": event.text} if first else {"content": event.text}
            delta.update(_reasoning(event.reasoning))
            logprobs = chat_logprobs(event.logprobs or []) if self.want_logprobs else None
            body = {"index": event.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        else:
            logprobs = completion_logprobs(event.logprobs or [], offset) if self.want_logprobs else None
            body = {"index": event.index, "text": event.text, "logprobs": logprobs, "finish_reason": finish}
        if finish is not None:
            body["stop_reason"] = choice.stop_reason
        return self._chunk_envelope([body], None, include_usage)

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        return self._chunk_envelope([], usage_json(usage), True)

    def _chunk_envelope(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None,
                        include_usage: bool) -> dict[str, Any]:
        chunk = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.kind == "chat" else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if include_usage:
            chunk["usage"] = usage
        return chunk
