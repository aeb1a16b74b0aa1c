"""What local third-party backends (CTranslate2, ExLlamaV2) share around their token loop: one hop from their
engine's thread to the caller (LocalBackend), and a Request turned into prompt ids and choices (LocalRequest).

These engines hand back raw token ids, from threads of their own, straight into the caller's EventChannel. Their
detokenizing, stop strings, stop ids, usage and timings go through the output stage our own engine uses
(stages/output.py), run by the caller as it reads them (`LocalRequest.read`, the channel's stage): never in
CTranslate2's per-token callback, which runs inside its decoding loop and would slow every step of the batch,
nor on a loop of the backend's own. Their prompts go through the prompt stage (stages/prompt.py), in `submit`, on
the caller's side too.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

from inferplug.backends.base import Backend
from inferplug.backends.bridge import EventChannel
from inferplug.errors import CLOSED, BackendUnavailable, RequestError
from inferplug.stages.output import ChoiceOutput, RequestChoices, stop_ids
from inferplug.stages.prompt import max_new_tokens, prompt_token_ids
from inferplug.types import Event, Request, SamplingParams


class LocalBackend(Backend):
    """A backend whose engine feeds the caller's EventChannel itself; `generate` reads it on the caller's loop."""

    def submit(self, request: Request, channel: EventChannel) -> None:
        if self.closed:
            channel.send([BackendUnavailable(CLOSED)], last=True)
            return
        try:
            self._start(request, channel)
        except Exception as exc:  # noqa: BLE001 - a bad request (RequestError), raised in the consumer before any event
            channel.send([exc], last=True)

    @abstractmethod
    def _start(self, request: Request, channel: EventChannel) -> None:
        """Check the request (raising before anything is handed to the engine), give the channel its LocalRequest's
        stage (`read`) and hand the request to the engine, which sends its raw items to the channel."""

    @abstractmethod
    def cancel_now(self, request_id: str) -> None: ...

    def generate(self, request: Request) -> AsyncIterator[Event]:
        return self.stream_async(request)


def reject_unsupported(backend_name: str, params: SamplingParams, request: Request, **supported: bool) -> None:
    """RequestError for options this backend cannot honour, rather than silently ignoring them."""
    checks = {
        "min_p": params.min_p != 0.0,
        "presence_penalty": params.presence_penalty != 0.0,
        "frequency_penalty": params.frequency_penalty != 0.0,
        "json_schema": params.json_schema is not None,
        "logit_bias": bool(params.logit_bias),
        "top_logprobs": bool(params.logprobs),
        "documents": request.documents is not None,
    }
    for param, used in checks.items():
        if used and not supported.get(param, False):
            raise RequestError(
                f"{param} is not supported by the {backend_name} backend; drop it or use the native backend",
                param=param,
            )


@dataclass
class LocalRequest:
    """One request on a local backend: its prompt ids, token limit, end ids and its output stage."""

    ids: list[int]
    limit: int
    end_ids: set[int]  # what its engine is told to stop on (stages/output.stop_ids)
    output: RequestChoices
    cached_tokens: int = 0  # of the prompt, as its engine reports them (usage)

    @classmethod
    def start(cls, backend: Backend, request: Request, eos_ids: Iterable[int | None], **supported: bool) -> LocalRequest:
        """Check the request (RequestError before any event) and set up its choices; `supported` as in
        reject_unsupported."""
        params = request.params
        reject_unsupported(backend.name, params, request, **supported)
        ids = prompt_token_ids(backend, request)
        limit = max_new_tokens(params, len(ids), backend.context_length)
        eos = {t for t in eos_ids if t is not None}
        output = RequestChoices.create(request, backend.tokenizer, ids, eos, limit, backend.reasoning_parser)
        return cls(ids, limit, stop_ids(params, eos), output)

    @property
    def choices(self) -> list[ChoiceOutput]:
        return self.output.choices

    @property
    def done(self) -> bool:
        return self.output.done

    def read_on(self, channel: EventChannel, events_of: Callable[[Any], Iterable[Event]]) -> None:
        """Make `read` the channel's stage, over the raw items its engine sends (events_of: one item's events). A stop
        string is found only there, so with stop strings the consumer reads the tokens as they come."""
        channel.read_with(partial(self.read, events_of), early=bool(self.choices[0].params.stop))

    def read(self, events_of: Callable[[Any], Iterable[Event]], items: list[Any]) -> tuple[list[Any], bool]:
        """The output stage over the raw items its engine sent (events_of: one item's events), run by the consumer
        (the channel's stage): their events, the request's last with usage and timings, and whether it is done. An
        exception passes through, raised in the consumer."""
        events: list[Any] = []
        for item in items:
            if isinstance(item, BaseException):
                events.append(item)
            else:
                events += (self.output.close(event, self.cached_tokens) for event in events_of(item))
        return events, self.done
