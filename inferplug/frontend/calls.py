"""Collecting the results of requests run on a Backend, from any thread or event loop.

Sync callers use `generate_all` for results (one call's, or a batch's) and `Backend.stream_sync` for a stream,
async callers `acollect` and `Backend.stream_async` on their own loop, all over the backend's one bridge
(backends/bridge.py); many concurrent calls from LangChain/LlamaIndex all land in the engine's continuous batch. A
caller that wants only the result gets the events at the end, in one wake-up.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from inferplug.backends.bridge import consume_all_sync
from inferplug.errors import GenerationError
from inferplug.frontend.forced_call import forced_calls
from inferplug.frontend.tool_calls import CALL_OPEN, ToolCall, calls_from_deltas, parse_tool_calls
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

    def content(self, calls: list[ToolCall]) -> str:
        """The answer's content beside its `calls`: all its text without calls; beside a reply format's own calls
        (harmony's, Gemma 4's) the text they leave, a preamble the user sees; beside calls parsed out of the text,
        the prose before a first <tool_call> tag (as the server's split gives it), else none."""
        if not calls or self.tool_calls:
            return self.text
        before = self.text[:max(self.text.find(CALL_OPEN), 0)]
        return before if before.strip() else ""


def collect(events: Iterable[Event]) -> Result:
    """A request's events (choice 0's text, reasoning, calls and logprobs; the request's usage and timings) folded
    into its Result; raises on an engine-side error."""
    result, parts, reasoning = Result(), [], []
    call_deltas: list[ToolCallDelta] = []
    for event in events:
        if event.error:
            raise _failed(event)
        if event.index == 0:
            parts.append(event.text)
            reasoning.append(event.reasoning)
            call_deltas += event.tool_calls
            if event.logprobs is not None:
                result.logprobs = result.logprobs or []
                result.logprobs.extend(event.logprobs)
            result.token_ids += event.token_ids
            result.prompt_logprobs = event.prompt_logprobs or result.prompt_logprobs
            if event.finish_reason is not None:
                result.finish_reason, result.stop_reason = event.finish_reason, event.stop_reason
        if event.usage is not None:
            result.usage = event.usage
        if event.timings is not None:
            result.timings = event.timings
    result.text, result.reasoning = "".join(parts), "".join(reasoning)
    result.tool_calls = calls_from_deltas(call_deltas) if call_deltas else []
    return result


class ResultBuilder:
    """A stream's events, kept as they come (an engine-side error raises at once) and folded into its Result at the
    end (collect)."""

    def __init__(self) -> None:
        self._events: list[Event] = []

    def add(self, event: Event) -> None:
        if event.error:
            raise _failed(event)
        self._events.append(event)

    def build(self) -> Result:
        return collect(self._events)


def _failed(event: Event) -> GenerationError:
    return GenerationError(f"generation failed: {event.error}")


async def acollect(backend: Any, request: Request, timeout: float | None = None) -> Result:
    """The request's Result on the caller's loop (all its events at the end, one wake-up); timeout as generate_all's."""
    return collect([event async for event in backend.stream_async(request, at_end=True, timeout=timeout)])


def generate_all(backend: Any, requests: list[Request], timeout: float | None = None) -> list[Result]:
    """Submit every request at once and wait for all in this thread, over the one bridge: they share the engine's
    decode steps, and a sync call (one request) waits for its finished Result with no stream in between. Raises the
    first failed request's error once all have ended; timeout: seconds before those not ended are aborted and
    GenerationError raised (None: no limit)."""
    ended = consume_all_sync([partial(backend.submit, r) for r in requests],
                             [partial(backend.cancel_now, r.request_id) for r in requests], timeout=timeout)
    return [collect(events) for events in ended]
