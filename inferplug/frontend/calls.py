"""Collecting the results of requests run on a Backend, from any thread or event loop.

Sync callers use `Backend.stream_sync` (or `generate_all` for a batch), async callers `Backend.stream_async` on
their own loop, all over the backend's one bridge (backends/bridge.py); many concurrent calls from
LangChain/LlamaIndex all land in the engine's continuous batch. A caller that wants only the result asks for the
events at the end.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from inferplug.backends.bridge import consume_all_sync
from inferplug.errors import GenerationError
from inferplug.frontend.forced_call import forced_calls
from inferplug.frontend.tool_calls import ToolCall, calls_from_deltas, parse_tool_calls
from inferplug.types import Event, Request, Timings, TokenLogprob, ToolCallDelta, Usage


@dataclass
class Result:
    """One finished choice: its text, why it stopped, and the request's usage and timings."""

    text: str = ""
    reasoning: str = ""  # a reasoning model's think text (Event.reasoning)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    usage: Usage = field(default_factory=Usage)
    timings: Timings | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None  # when the request asked for them
    prompt_logprobs: list[TokenLogprob | None] | None = None  # SamplingParams.prompt_logprobs, when asked for
    tool_calls: list[ToolCall] = field(default_factory=list)  # calls the backend parsed itself (a remote server)

    def calls(self, tools: list[dict[str, Any]], required: bool = False) -> list[ToolCall]:
        """The answer's calls to `tools`: the backend's own, else those written in the text; a `required` (or
        named) choice's answer is its call always, cut short or not (frontend/forced_call.py)."""
        if not tools:
            return []
        return self.tool_calls or (forced_calls(self.text, tools, parallel=False) if required
                                   else parse_tool_calls(self.text, tools))


class ResultBuilder:
    """Folds a request's events (choice 0) into a Result; raises on an engine-side error."""

    def __init__(self) -> None:
        self.result = Result()
        self._parts: list[str] = []
        self._reasoning: list[str] = []
        self._call_deltas: list[ToolCallDelta] = []

    def add(self, event: Event) -> None:
        if event.error:
            raise GenerationError(f"generation failed: {event.error}")
        if event.index == 0:
            self._parts.append(event.text)
            self._reasoning.append(event.reasoning)
            self._call_deltas += event.tool_calls
            if event.logprobs is not None:
                self.result.logprobs = self.result.logprobs or []
                self.result.logprobs.extend(event.logprobs)
            self.result.token_ids += event.token_ids
            self.result.prompt_logprobs = event.prompt_logprobs or self.result.prompt_logprobs
            if event.finish_reason is not None:
                self.result.finish_reason, self.result.stop_reason = event.finish_reason, event.stop_reason
        if event.usage is not None:
            self.result.usage = event.usage
        if event.timings is not None:
            self.result.timings = event.timings

    def build(self) -> Result:
        self.result.text = "".join(self._parts)
        self.result.reasoning = "".join(self._reasoning)
        self.result.tool_calls = calls_from_deltas(self._call_deltas) if self._call_deltas else []
        return self.result


def collect(events: Iterable[Event]) -> Result:
    builder = ResultBuilder()
    for event in events:
        builder.add(event)
    return builder.build()


async def acollect(backend: Any, request: Request) -> Result:
    builder = ResultBuilder()
    async for event in backend.stream_async(request, at_end=True):
        builder.add(event)
    return builder.build()


def generate_all(backend: Any, requests: list[Request]) -> list[Result]:
    """Submit every request at once and wait for all in this thread, over the one bridge: they share the engine's
    decode steps. Raises the first failed request's error once all have ended."""
    ended = consume_all_sync([partial(backend.submit, r) for r in requests],
                             [partial(backend.cancel_now, r.request_id) for r in requests])
    return [collect(events) for events in ended]
