"""Backend Events -> OpenAI response objects: whole responses, stream chunks, usage, logprobs."""

from __future__ import annotations

import dataclasses
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from inferplug.frontend.openai_logprobs import chat_logprobs, completion_logprobs, vllm_prompt_logprobs
from inferplug.frontend.tool_calls import all_whole, calls_from_deltas, finish_with_calls
from inferplug.server.echo import Echo
from inferplug.server.tool_output import ToolCallText, call_delta_json, tool_calls_json
from inferplug.types import Event, TokenLogprob, ToolCallDelta, Usage

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


@dataclass
class ChoiceState:
    text: str = ""
    reasoning: str = ""  # a reasoning model's think text: `reasoning_content`, as vLLM's reasoning parsers send it
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob | None] | None = None  # SamplingParams.prompt_logprobs (vLLM's field)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    started: bool = False  # a chat stream sends the role once, in the first chunk
    tool_text: ToolCallText | None = None  # with tools offered: the text that may become tool calls
    call_deltas: list[ToolCallDelta] = field(default_factory=list)  # calls a remote backend parsed itself


class ResponseBuilder:
    """Builds one call's responses from its events, for /v1/chat/completions or /v1/completions."""

    def __init__(self, kind: Kind, model: str, num_choices: int, want_logprobs: bool,
                 tools: list[dict[str, Any]] | None = None, parallel_tool_calls: bool = True,
                 tool_required: bool = False, *, echo: Echo | None = None, want_prompt_logprobs: bool = False):
        """`tool_required`: a required or named tool_choice, answered in tool_calls always; `echo`: completions'
        echo (server/echo.py); `want_prompt_logprobs`: vLLM's prompt_logprobs per choice."""
        self.kind = kind
        self.model = model
        self.want_logprobs = want_logprobs
        self.echo, self.want_prompt_logprobs = echo, want_prompt_logprobs
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.choices = [ChoiceState(tool_text=ToolCallText(tools, parallel_tool_calls, tool_required) if tools
                                    else None) for _ in range(num_choices)]
        self.aborted = False  # some choice was aborted by the backend, not finished

    def add(self, event: Event) -> ChoiceState:
        return self._add(self._as_sent(event))

    def _as_sent(self, event: Event) -> Event:
        return self.echo.apply(event) if self.echo is not None else event

    def _add(self, event: Event) -> ChoiceState:
        choice = self.choices[event.index]
        if event.prompt_logprobs is not None:
            choice.prompt_logprobs = event.prompt_logprobs
        choice.text += event.text
        choice.reasoning += event.reasoning
        choice.logprobs.extend(event.logprobs or [])
        choice.call_deltas.extend(event.tool_calls)
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
            "usage": usage_json(self._usage(usage)),
        }

    def _usage(self, usage: Usage) -> Usage:
        """max_tokens 0 generated one token to score the prompt, and dropped it: none to count."""
        return dataclasses.replace(usage, completion_tokens=0) if self.echo and self.echo.prompt_only else usage

    def _choice(self, index: int, c: ChoiceState) -> dict[str, Any]:
        if self.kind == "chat":
            logprobs = chat_logprobs(c.logprobs) if self.want_logprobs else None
            calls = calls_from_deltas(c.call_deltas)  # a reply format's own (harmony, Gemma 4): the text beside
            content = c.text  # is content, as streamed
            if not calls and c.tool_text is not None:
                content, calls = c.tool_text.split(c.text)
            message = ({"role": "assistant", "content": content or None, "tool_calls": tool_calls_json(calls)}
                       if calls else {"role": "assistant", "content": c.text})
            message.update(_reasoning(c.reasoning))
            return {"index": index, "message": message, "logprobs": logprobs,
                    "finish_reason": finish_with_calls(c.finish_reason, all_whole(calls)), "stop_reason": c.stop_reason}
        logprobs = completion_logprobs(c.logprobs, 0) if self.want_logprobs else None
        body = {"index": index, "text": c.text, "logprobs": logprobs, "finish_reason": c.finish_reason,
                "stop_reason": c.stop_reason}
        if self.want_prompt_logprobs:
            body["prompt_logprobs"] = vllm_prompt_logprobs(c.prompt_logprobs or [])
        return body

    # --- stream chunks ------------------------------------------------------------
    def chunk(self, event: Event, include_usage: bool) -> dict[str, Any] | None:
        """The chunk for one event, or None when it carries nothing to send."""
        event = self._as_sent(event)
        choice = self.choices[event.index]
        offset = len(choice.text)
        first = not choice.started
        self._add(event)
        choice.started = True
        if not (event.text or event.reasoning or event.tool_calls or event.finish_reason or first
                or (self.want_logprobs and event.logprobs)):
            return None
        finish = choice.finish_reason if event.finish_reason else None
        if self.kind == "chat":
            delta = self._chat_delta(choice, event, finish is not None) | _reasoning(event.reasoning)
            if not (delta["content"] or event.reasoning or "tool_calls" in delta or finish or first
                    or (self.want_logprobs and event.logprobs)):
                return None  # text held back: it may be a tool call
            tool_text = choice.tool_text
            called = bool(choice.call_deltas) or (tool_text is not None and tool_text.called and not tool_text.cut)
            finish = finish_with_calls(finish, called)
            if first:
                delta = {"role": "assistant", **delta}
            logprobs = chat_logprobs(event.logprobs or []) if self.want_logprobs else None
            body = {"index": event.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        else:
            logprobs = completion_logprobs(event.logprobs or [], offset) if self.want_logprobs else None
            body = {"index": event.index, "text": event.text, "logprobs": logprobs, "finish_reason": finish}
        if finish is not None:
            body["stop_reason"] = choice.stop_reason
        return self._chunk_envelope([body], None, include_usage)

    @staticmethod
    def _chat_delta(choice: ChoiceState, event: Event, finished: bool) -> dict[str, Any]:
        """The content and call pieces to send for an event: with tools, text is held while it may be a call; a
        remote's call pieces pass through as they came, its ids kept."""
        content, pieces = choice.tool_text.feed(event.text) if choice.tool_text is not None else (event.text, [])
        if finished and choice.tool_text is not None and not choice.call_deltas:  # a remote's calls are whole
            held, more = choice.tool_text.finish()
            content, pieces = content + held, pieces + more
        pieces += event.tool_calls
        return {"content": content or None, "tool_calls": [call_delta_json(p) for p in pieces]} if pieces \
            else {"content": content}

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        return self._chunk_envelope([], usage_json(self._usage(usage)), True)

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
