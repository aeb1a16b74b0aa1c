"""What local third-party backends (CTranslate2, ExLlamaV2) share around their token loop:
turning a Request into prompt ids and choices (LocalRequest), and one choice's sampled tokens into Events.

Our own engine does this inside itself; these engines hand back raw token ids, so the
detokenizing, stop strings, stop ids, usage and timings are done here, the same way for both.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inferplug.engine.detokenizer import IncrementalDetokenizer
from inferplug.errors import RequestError
from inferplug.types import Event, FinishReason, Request, SamplingParams, Timings, TokenLogprob, Usage

if TYPE_CHECKING:
    from inferplug.backends.base import Backend


def prompt_token_ids(backend: Backend, request: Request) -> list[int]:
    """The request's prompt as token ids, checked against the vocabulary and the context."""
    tokenizer = backend.tokenizer
    if request.messages is not None:
        text = backend.apply_chat_template(request.messages, request.tools)
        ids = tokenizer.encode(text, add_special_tokens=False)
    elif isinstance(request.prompt, str):
        ids = tokenizer.encode(request.prompt)
    else:
        ids = list(request.prompt or [])
        vocab = len(tokenizer)
        bad = [t for t in ids if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise RequestError(f"prompt holds token ids outside the vocabulary [0, {vocab}): {bad[:5]}", param="prompt")
    check_fits_context(len(ids), backend.context_length, request)
    return ids


def check_fits_context(prompt_len: int, context_length: int, request: Request) -> None:
    if prompt_len >= context_length:
        raise RequestError(
            f"the prompt is {prompt_len} tokens but the model's context is {context_length}; "
            "shorten the prompt so there is room for at least one new token",
            param="messages" if request.messages is not None else "prompt",
        )


def max_new_tokens(params: SamplingParams, prompt_len: int, context_length: int) -> int:
    """max_tokens, capped at the room left in the context (None means all of it)."""
    room = context_length - prompt_len
    return room if params.max_tokens is None else min(params.max_tokens, room)


def reject_unsupported(backend_name: str, params: SamplingParams, request: Request, **supported: bool) -> None:
    """RequestError for options this backend cannot honour, rather than silently ignoring them."""
    checks = {
        "min_p": params.min_p != 0.0,
        "presence_penalty": params.presence_penalty != 0.0,
        "frequency_penalty": params.frequency_penalty != 0.0,
        "json_schema": params.json_schema is not None,
        "top_logprobs": bool(params.logprobs),
        "documents": request.documents is not None,
    }
    for param, used in checks.items():
        if used and not supported.get(param, False):
            raise RequestError(
                f"{param} is not supported by the {backend_name} backend; drop it or use the native backend",
                param=param,
            )


def engine_stop_ids(params: SamplingParams, end_ids: set[int]) -> list[int]:
    """The ids the engine itself stops on: stop_token_ids always, EOS only without ignore_eos
    (as in vLLM and our native engine)."""
    return sorted(set(params.stop_token_ids) if params.ignore_eos else end_ids)


@dataclass
class RequestClock:
    """Timings of one request, measured where its events are produced."""

    submitted: float = field(default_factory=time.perf_counter)
    started: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    tokens: int = 0

    def on_token(self) -> None:
        now = time.perf_counter()
        self.started = self.started or now
        self.first_token = self.first_token or now
        self.last_token = now
        self.tokens += 1

    def timings(self) -> Timings:
        end = time.perf_counter()
        ttft = None if self.first_token is None else self.first_token - self.submitted
        tpot = None
        if self.tokens >= 2 and self.first_token is not None and self.last_token is not None:
            tpot = (self.last_token - self.first_token) / (self.tokens - 1)
        started = self.started or end
        return Timings(queued=started - self.submitted, ttft=ttft, tpot=tpot, e2e=end - self.submitted)


class ChoiceStream:
    """One choice of a request: sampled token ids in, Events out.

    `end_ids` are the ids that end the choice (EOS and stop_token_ids; EOS not with
    ignore_eos); their text is not emitted. Stop strings are found across token boundaries by the detokenizer.
    """

    def __init__(self, request_id: str, index: int, tokenizer: Any, prompt_ids: list[int],
                 params: SamplingParams, end_ids: set[int], max_tokens: int, reasoning_parser: str | None = None):
        from inferplug.frontend.reasoning import ReasoningSplitter

        self.request_id = request_id
        self.index = index
        self.params = params
        self.end_ids = end_ids
        self.max_tokens = max_tokens
        self.detok = IncrementalDetokenizer(tokenizer, prompt_ids, params.stop, params.include_stop_str_in_output)
        self.tokenizer = tokenizer
        self.completion_tokens = 0
        self.finish_reason: FinishReason | None = None
        self.reasoning = ReasoningSplitter(reasoning_parser) if reasoning_parser else None

    def _text(self, event: Event, final: bool) -> Event:
        """The detokenizer's new text on the event, a reasoning model's think part moved to `reasoning`."""
        event.text = self.detok.delta(final=final)
        if self.reasoning is not None:
            event.text, event.reasoning = self.reasoning.feed(event.text, final=final)
        return event

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def on_token(self, token_id: int, logprob: float | None = None,
                 top: list[tuple[int, str, float]] | None = None) -> Event:
        """The event for one sampled token (finished when it ends the choice)."""
        self.completion_tokens += 1
        event = Event(self.request_id, self.index, token_ids=[token_id])
        if self.params.logprobs is not None and logprob is not None:
            event.logprobs = [TokenLogprob(token_id, self.tokenizer.decode([token_id]), logprob, top or [])]
        if token_id in self.params.stop_token_ids:  # whatever ignore_eos says
            return self._finish(event, "stop", token_id)
        if token_id in self.end_ids and not self.params.ignore_eos:
            return self._finish(event, "stop", None)
        stop = self.detok.add(token_id)
        if stop is not None:
            return self._finish(event, "stop", stop)
        if self.completion_tokens >= self.max_tokens:
            return self._finish(event, "length", None)
        return self._text(event, final=False)

    def finish(self, reason: FinishReason, error: str | None = None) -> Event:
        """The closing event when the engine ends the choice itself (length, abort, error)."""
        return self._finish(Event(self.request_id, self.index, error=error), reason, None)

    def _finish(self, event: Event, reason: FinishReason, stop_reason: str | int | None) -> Event:
        self.finish_reason = reason
        event.finish_reason = reason
        event.stop_reason = stop_reason
        return self._text(event, final=True)


@dataclass
class LocalRequest:
    """One request on a local backend: its prompt ids, token limit, end ids and one ChoiceStream per choice."""

    ids: list[int]
    limit: int
    end_ids: set[int]  # EOS and stop_token_ids
    choices: list[ChoiceStream]
    clock: RequestClock

    @classmethod
    def start(cls, backend: Backend, request: Request, eos_ids: Iterable[int | None], **supported: bool) -> LocalRequest:
        """Check the request (RequestError before any event) and set up its choices; `supported` as in
        reject_unsupported."""
        params = request.params
        params.validate(len(backend.tokenizer))
        reject_unsupported(backend.name, params, request, **supported)
        clock = RequestClock()
        ids = prompt_token_ids(backend, request)
        limit = max_new_tokens(params, len(ids), backend.context_length)
        end_ids = {t for t in eos_ids if t is not None} | set(params.stop_token_ids)
        choices = [ChoiceStream(request.request_id, i, backend.tokenizer, ids, params, end_ids, limit,
                                backend.reasoning_parser) for i in range(params.n)]
        return cls(ids, limit, end_ids, choices, clock)

    @property
    def done(self) -> bool:
        return all(c.done for c in self.choices)

    def finish_or_tick(self, event: Event, cached_tokens: int) -> Event:
        """The request's last event gets its usage and timings; an event with tokens ticks the clock."""
        if event.finish_reason is not None and self.done:
            completion = sum(c.completion_tokens for c in self.choices)
            event.usage = Usage(len(self.ids), completion, cached_tokens)
            event.timings = self.clock.timings()
        elif event.token_ids:
            self.clock.on_token()
        return event
