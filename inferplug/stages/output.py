"""The output stage: sampled token ids in, Events out, the same for our engine and the local backends.

A ChoiceOutput turns one choice's tokens into text (incremental detokenizing; a reasoning model's
think part moved to Event.reasoning, gpt-oss's harmony tool calls to Event.tool_calls), ends the choice on a stop
token id, EOS, a stop string, the end of its grammar or its length, and formats logprobs. A
RequestChoices holds a request's choices and puts usage and timings on its last event. (It was also named
RequestOutput, the public type's name: inferplug.RequestOutput is the one request output.)
Engines hand over raw token ids only; nothing here touches KV blocks or token counts.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from inferplug.stages.detokenizer import IncrementalDetokenizer
from inferplug.stages.prompt_logprobs import PromptLogprobs
from inferplug.stages.gemma4_channels import Gemma4Splitter
from inferplug.stages.harmony import HarmonySplitter
from inferplug.stages.reasoning import ReasoningSplitter
from inferplug.types import Event, FinishReason, Request, SamplingParams, Timings, TokenLogprob, Usage


@dataclass
class TokenEnd:
    """What a sampled token's id decided (ChoiceOutput.count_token): the reason it ends its choice, if it does."""

    reason: FinishReason | None = None
    stop_reason: int | None = None
    by_id: bool = False  # a stop token id or EOS: its text is not decoded


def splitter(parser: str,
             callable_names: frozenset[str] = frozenset()) -> ReasoningSplitter | HarmonySplitter | Gemma4Splitter:
    """The output splitter a reasoning parser names: harmony's channels (gpt-oss), Gemma 4's, or think tags.
    `callable_names`: the functions the request offered; a call to another is no tool call."""
    if parser == "openai_gptoss":
        return HarmonySplitter(callable_names)
    return Gemma4Splitter(callable_names) if parser == "gemma4" else ReasoningSplitter(parser)


def stop_ids(params: SamplingParams, eos_ids: Collection[int]) -> set[int]:
    """The token ids that end a choice (after min_tokens): stop_token_ids always, EOS unless ignore_eos, as in vLLM.
    The one place this is decided: the native engine's choices and beams, and what the local backends' engines
    are told to stop on."""
    return set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_ids))


class ChoiceOutput:
    """One choice: it ends at one of `stop_ids(params, eos_ids)`, a stop string, the grammar's end or the length."""

    def __init__(self, request_id: str, index: int, tokenizer: Any, prompt_ids: list[int], params: SamplingParams,
                 eos_ids: Collection[int], max_tokens: int, reasoning_parser: str | None = None,
                 callable_names: frozenset[str] = frozenset()):
        self.request_id, self.index, self.tokenizer = request_id, index, tokenizer
        self.reasoning = splitter(reasoning_parser, callable_names) if reasoning_parser else None
        self.params, self.end_ids, self.max_tokens = params, stop_ids(params, eos_ids), max_tokens
        self.detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids, params.stop, params.include_stop_str_in_output,
                                                  keep_special=self.reasoning is not None
                                                  and self.reasoning.reads_control_tokens)
        self.num_tokens = 0  # tokens whose text is out (usage counts these)
        self.sampled = 0  # tokens counted where they are sampled (count_token): ahead of num_tokens by a step or so
        self.finish_reason: FinishReason | None = None
        self.stop_reason: str | int | None = None
        self.first_token_time: float | None = None
        self.finished_time: float | None = None
        # the request's prompt logprobs (the first choice's), filled by the engine and put on the first event
        self.prompt = PromptLogprobs(prompt_ids, params.prompt_logprobs) \
            if params.prompt_logprobs is not None and index == 0 else None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def on_token(self, token_id: int, logprob: float | None = None, top: list[tuple[int, float]] | None = None,
                 *, grammar_done: bool = False, at: float | None = None) -> Event:
        """The event for one sampled token (its choice's last when the token ends it): both parts at once. at: the
        perf_counter time it was sampled, for the timings, when that was not now (a consumer reads it later)."""
        return self.text(self.count_token(token_id, grammar_done=grammar_done), token_id, logprob, top, at=at)

    def count_token(self, token_id: int, *, grammar_done: bool = False) -> TokenEnd:
        """The part decided where the token is sampled, from its id alone: whether it ends the choice (a stop token
        id, EOS, the grammar's end, the length). A stop string is the text's part (`text`)."""
        self.sampled += 1
        reason, stop = self._stop_token(token_id)
        if reason is not None:
            return TokenEnd(reason, stop, by_id=True)
        return TokenEnd("stop" if grammar_done else "length" if self.sampled >= self.max_tokens else None)

    def text(self, end: TokenEnd, token_id: int, logprob: float | None = None,
             top: list[tuple[int, float]] | None = None, *, at: float | None = None) -> Event:
        """The token's event: its text (a stop string in it ends the choice "stop"), logprobs and prompt logprobs.
        Runs off the engine's step, after count_token."""
        self.num_tokens += 1
        self.first_token_time = self.first_token_time or at or time.perf_counter()
        event = Event(self.request_id, self.index, token_ids=[token_id])
        if self.prompt is not None and self.num_tokens == 1:
            event.prompt_logprobs = self.prompt.entries(self.tokenizer)
        if self.params.logprobs is not None and logprob is not None:
            text = self.tokenizer.decode
            event.logprobs = [TokenLogprob(token_id, text([token_id]), logprob,
                                           [(t, text([t]), lp) for t, lp in top or []])]
        reason, stop = end.reason, end.stop_reason
        if not end.by_id and (found := self.detokenizer.add(token_id)) is not None:
            reason, stop = "stop", found
        if reason is not None:
            return self._finish(event, reason, stop, at)
        return self._text(event, final=False)

    def finish(self, reason: FinishReason, error: str | None = None, *, at: float | None = None) -> Event:
        """The closing event when the engine ends the choice itself (abort, error, its own length limit)."""
        return self._finish(Event(self.request_id, self.index, error=error), reason, None, at)

    def _stop_token(self, token_id: int) -> tuple[FinishReason | None, int | None]:
        p = self.params
        if self.sampled <= p.min_tokens:
            return None, None
        if token_id in self.end_ids:  # the stop reason names a stop token id, not EOS
            return "stop", token_id if token_id in p.stop_token_ids else None
        return None, None

    def _finish(self, event: Event, reason: FinishReason, stop_reason: str | int | None, at: float | None) -> Event:
        self.finish_reason, self.stop_reason = reason, stop_reason
        self.finished_time = at or time.perf_counter()
        event.finish_reason, event.stop_reason = reason, stop_reason
        return self._text(event, final=True)

    def _text(self, event: Event, final: bool) -> Event:
        """The detokenizer's new text on the event, a reasoning model's think part moved to `reasoning`."""
        event.text = self.detokenizer.delta(final=final)
        if self.reasoning is not None:
            event.text, event.reasoning = self.reasoning.feed(event.text, final=final)
            event.tool_calls = self.reasoning.take_calls()
        return event


@dataclass
class RequestChoices:
    """A request's choices; its last event carries usage and timings."""

    choices: list[ChoiceOutput]
    num_prompt_tokens: int
    arrival: float = field(default_factory=time.perf_counter)

    @classmethod
    def create(cls, request: Request, tokenizer: Any, prompt_ids: list[int], eos_ids: Collection[int],
               max_tokens: int, reasoning_parser: str | None = None) -> RequestChoices:
        offered = frozenset(t["function"]["name"] for t in request.tools or [])  # none under tool_choice "none"
        return cls([ChoiceOutput(request.request_id, i, tokenizer, prompt_ids, request.params, eos_ids, max_tokens,
                                 reasoning_parser, offered) for i in range(request.params.n)], len(prompt_ids))

    @property
    def done(self) -> bool:
        return all(c.done for c in self.choices)

    def close(self, event: Event, cached_tokens: int, started: float | None = None) -> Event:
        """Put usage and timings on the request's last event (`started`: when it was first scheduled)."""
        if event.finish_reason is not None and self.done:
            event.usage = Usage(self.num_prompt_tokens, sum(c.num_tokens for c in self.choices), cached_tokens)
            event.timings = self.timings(started)
        return event

    def timings(self, started: float | None = None) -> Timings:
        arrival = self.arrival
        end = max(c.finished_time or arrival for c in self.choices)
        first_tokens = [c.first_token_time for c in self.choices if c.first_token_time]
        started = started or min(first_tokens, default=end)
        per_token = [(c.finished_time - c.first_token_time) / (c.num_tokens - 1)
                     for c in self.choices if c.first_token_time and c.finished_time and c.num_tokens > 1]
        return Timings(queued=started - arrival, ttft=min(first_tokens) - arrival if first_tokens else None,
                       tpot=sum(per_token) / len(per_token) if per_token else None, e2e=end - arrival)


def __getattr__(name: str) -> Any:
    """The old name, for one release: it warns, naming the new ones."""
    if name == "RequestOutput":
        import warnings

        from inferplug.errors import InferPlugDeprecationWarning

        warnings.warn("inferplug.stages.output.RequestOutput is renamed RequestChoices (the output stage's per-request "
                      "state); the public request output is inferplug.RequestOutput", InferPlugDeprecationWarning,
                      stacklevel=2)
        return RequestChoices
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
