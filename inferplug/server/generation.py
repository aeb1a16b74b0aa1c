"""One API call as backend requests: several prompts, n choices each, merged into one stream.

A backend without native n gets n single-choice requests instead. Every request is started
(its first event awaited) before the HTTP response begins, so bad input is a 4xx, not an
error in the middle of a stream. Closing the Generation aborts whatever is still running.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from inferplug.backends.base import Backend
from inferplug.types import Event, Request, Usage

_DONE = object()


@dataclasses.dataclass
class _Part:
    request: Request
    first_choice: int  # this request's choice 0 is the call's choice `first_choice`
    counts_prompt: bool  # False for the extra copies of a fanned-out prompt (counted once)
    stream: AsyncIterator[Event] | None = None
    first: Event | None = None
    unfinished: set[int] = dataclasses.field(default_factory=set)  # this request's choices still running

    def __post_init__(self) -> None:
        self.unfinished = set(range(self.request.params.n))


class Generation:
    def __init__(self, backend: Backend, requests: list[Request]):
        """`requests`: one per prompt of the call, each with the call's sampling params."""
        self.backend = backend
        self.usage = Usage()
        self.started = time.perf_counter()
        self.first_token_at: float | None = None
        self._parts: list[_Part] = []
        for i, request in enumerate(requests):
            n = request.params.n
            if n == 1 or backend.capabilities.n:
                self._parts.append(_Part(request, i * n, True))
                continue
            for j in range(n):
                seed = None if request.params.seed is None else request.params.seed + j
                copy = dataclasses.replace(request.params, n=1, seed=seed, stop=list(request.params.stop))
                self._parts.append(_Part(dataclasses.replace(request, params=copy, request_id=uuid.uuid4().hex),
                                         i * n + j, j == 0))
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []
        self._on_close: list[Callable[[], None]] = []  # run once, by the first aclose

    def on_close(self, callback: Callable[[], None]) -> None:
        self._on_close.append(callback)

    @property
    def request_ids(self) -> list[str]:
        return [p.request.request_id for p in self._parts]

    async def start(self) -> None:
        """Submit every request and wait for its first event; the first RequestError is raised."""
        async def first(part: _Part) -> None:
            part.stream = self.backend.generate(part.request)
            part.first = await anext(part.stream)

        results = await asyncio.gather(*(first(p) for p in self._parts), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await self.aclose()
            raise errors[0]
        self._tasks = [asyncio.create_task(self._pump(p)) for p in self._parts]

    async def _pump(self, part: _Part) -> None:
        try:
            event = part.first
            while event is not None:
                if event.finish_reason is not None:
                    part.unfinished.discard(event.index)
                self._queue.put_nowait((part, event))
                event = await anext(part.stream, None)
        except Exception as exc:  # a backend failure ends every choice still running with an error event
            for index in sorted(part.unfinished) or [0]:  # none left: still surface the failure
                failed = Event(part.request.request_id, index=index, finish_reason="error", error=str(exc))
                self._queue.put_nowait((part, failed))
        finally:
            self._queue.put_nowait(_DONE)

    async def events(self) -> AsyncIterator[Event]:
        """Every event of the call, with `index` renumbered to the call's choice index."""
        remaining = len(self._tasks)
        while remaining:
            item = await self._queue.get()
            if item is _DONE:
                remaining -= 1
                continue
            part, event = item
            if self.first_token_at is None and event.token_ids:
                self.first_token_at = time.perf_counter()
            if event.usage is not None:
                self._add_usage(part, event.usage)
            yield dataclasses.replace(event, index=part.first_choice + event.index)

    def _add_usage(self, part: _Part, usage: Usage) -> None:
        self.usage.completion_tokens += usage.completion_tokens
        if part.counts_prompt:
            self.usage.prompt_tokens += usage.prompt_tokens
            self.usage.cached_tokens += usage.cached_tokens

    async def aclose(self) -> None:
        """Stop every request still running; its blocks go back to the pool. Safe to call twice.

        Shielded: Starlette cancels the handler through an anyio scope when the client leaves,
        and that scope would cancel these awaits too."""
        import anyio

        callbacks, self._on_close = self._on_close, []
        for callback in callbacks:
            callback()
        with anyio.CancelScope(shield=True):
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            for part in self._parts:
                if part.stream is not None:
                    await part.stream.aclose()
                await self.backend.abort(part.request.request_id)
