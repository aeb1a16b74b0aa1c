"""AsyncEngine: the LLMEngine step loop in a background thread, streaming Events to asyncio callers.

Each request gets an asyncio.Queue on its caller's loop, fed with `call_soon_threadsafe`. One lock
guards the engine: the step thread holds it for a step, add/abort take it between steps.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from inferplug.engine.llm_engine import LLMEngine
from inferplug.errors import BackendUnavailable
from inferplug.types import Event, Request


class AsyncEngine:
    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="inferplug-engine", daemon=True)
        self._thread.start()

    async def generate(self, request: Request) -> AsyncIterator[Event]:
        """Stream the request's events; the last one carries usage. RequestError comes before any event."""
        queue: asyncio.Queue = asyncio.Queue()
        rid = request.request_id
        # shielded: a caller cancelled mid-add still waits for the add to land, then aborts it (no orphan)
        add = asyncio.ensure_future(asyncio.to_thread(self._add, request, asyncio.get_running_loop(), queue))
        finished = False
        try:
            await asyncio.shield(add)
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                if item.usage is not None:
                    finished = True
                yield item
                if finished:
                    return
        finally:
            await asyncio.wait([add])
            # a failed add registered nothing, and its id may be another running request's
            if not finished and not add.cancelled() and add.exception() is None:
                await self.abort(rid)

    async def abort(self, request_id: str) -> None:
        """Cancel a request now: its blocks go back to the pool before this returns."""
        await asyncio.to_thread(self._abort, request_id)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return self.engine.stats()

    def close(self) -> None:
        """Stop the step thread; open streams end with BackendUnavailable and their blocks are freed."""
        with self._lock:
            self._closed = True
            self._fail_all(BackendUnavailable("the backend was closed while this request ran; create a new backend"))
        self._wake.set()
        self._thread.join(timeout=30)

    # --- the engine thread's side -----------------------------------------------
    def _add(self, request: Request, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue) -> None:
        with self._lock:
            if self._closed:
                raise BackendUnavailable("the backend is closed; create a new backend")
            self.engine.add_request(request)  # RequestError propagates to the caller
            self._streams[request.request_id] = (loop, queue)
        self._wake.set()

    def _abort(self, request_id: str) -> None:
        with self._lock:
            events = self.engine.abort(request_id)
        self._dispatch(events)

    def _loop(self) -> None:
        while not self._closed:
            self._wake.clear()
            with self._lock:
                busy = self.engine.has_unfinished()
                events = self._safe_step() if busy else []
            if not busy:
                self._wake.wait()
            elif not events:
                time.sleep(0)  # let add/abort take the lock between steps
            self._dispatch(events)

    def _safe_step(self) -> list[Event]:
        try:
            return self.engine.step()
        except Exception as exc:  # noqa: BLE001 - an engine bug must not hang every stream
            self._fail_all(exc)
            return []

    def _fail_all(self, exc: BaseException) -> None:
        """Abort every request and end every open stream with exc (the caller holds the lock)."""
        for rid in list(self.engine.requests):
            self.engine.abort(rid)
        for loop, queue in self._streams.values():
            _put(loop, queue, exc)
        self._streams.clear()

    def _dispatch(self, events: list[Event]) -> None:
        for event in events:
            target = self._streams.get(event.request_id)
            if target is None:
                continue
            if event.usage is not None:
                self._streams.pop(event.request_id, None)
            _put(*target, event)


def _put(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, item: Event | BaseException) -> None:
    try:
        loop.call_soon_threadsafe(queue.put_nowait, item)
    except RuntimeError:  # the caller's loop is closed: nobody is listening any more
        pass
