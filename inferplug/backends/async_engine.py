"""AsyncEngine: the LLMEngine step loop in a background thread, its events handed out through EventChannels.

Callers never wait for the engine: `submit` queues the request and its channel and returns; the
step thread adds queued requests between steps (a bad one ends its channel with the RequestError)
and sends each step's events to their channels, one send per channel per step. One lock guards the
engine: the step thread holds it for a step, `abort_now` and `stats` take it between steps.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

from inferplug.backends.bridge import EventChannel, consume_async
from inferplug.engine.llm_engine import LLMEngine
from inferplug.errors import BackendUnavailable
from inferplug.types import Event, Request


class AsyncEngine:
    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._inbox: deque[tuple[Request, EventChannel]] = deque()
        self._inbox_lock = threading.Lock()  # never held for a step: submit does not wait for the engine
        self._streams: dict[str, EventChannel] = {}
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="inferplug-engine", daemon=True)
        self._thread.start()

    def submit(self, request: Request, channel: EventChannel) -> None:
        """Queue the request; its events, or the RequestError that refuses it, go to channel."""
        with self._inbox_lock:
            if not self._closed:
                self._inbox.append((request, channel))
                self._wake.set()
                return
        channel.send([BackendUnavailable("the backend is closed; create a new backend")], last=True)

    def generate(self, request: Request) -> AsyncIterator[Event]:
        """Stream the request's events; the last one carries usage. RequestError comes before any event."""
        return consume_async(partial(self.submit, request), partial(self.abort_now, request.request_id))

    async def abort(self, request_id: str) -> None:
        """Cancel a request now: its blocks go back to the pool before this returns."""
        await asyncio.to_thread(self.abort_now, request_id)

    def abort_now(self, request_id: str) -> None:
        """abort() for a thread that may block (waits for the step in flight)."""
        with self._lock:
            self._admit()  # a request still queued is added first, so it is aborted, not started later
            events = self.engine.abort(request_id)
        self._dispatch(events)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return self.engine.stats()

    def close(self) -> None:
        """Stop the step thread; open streams end with BackendUnavailable and their blocks are freed."""
        with self._lock:
            with self._inbox_lock:
                self._closed = True
            self._admit()
            self._fail_all(BackendUnavailable("the backend was closed while this request ran; create a new backend"))
        self._wake.set()
        self._thread.join(timeout=30)
        self.engine.close()  # after the step thread: a tensor-parallel engine's workers stop

    # --- the engine thread's side (the lock held) ------------------------------------
    def _admit(self) -> None:
        while self._inbox:
            request, channel = self._inbox.popleft()
            try:
                self.engine.add_request(request)
            except Exception as exc:  # noqa: BLE001 - a bad request (RequestError) fails alone, before any event
                channel.send([exc], last=True)
                continue
            self._streams[request.request_id] = channel

    def _loop(self) -> None:
        while not self._closed:
            self._wake.clear()
            with self._lock:
                self._admit()
                busy = self.engine.has_unfinished()
                events = self._safe_step() if busy else []
            if not busy:
                self._wake.wait()
            elif not events:
                time.sleep(0)  # let abort/stats take the lock between steps
            self._dispatch(events)

    def _safe_step(self) -> list[Event]:
        try:
            return self.engine.step()
        except Exception as exc:  # noqa: BLE001 - an engine bug must not hang every stream
            self._fail_all(exc)
            return []

    def _fail_all(self, exc: BaseException) -> None:
        """Abort every request and end every open stream with exc."""
        for rid in list(self.engine.requests):
            self.engine.abort(rid)
        for channel in self._streams.values():
            channel.send([exc], last=True)
        self._streams.clear()

    def _dispatch(self, events: list[Event]) -> None:
        """One send per channel: a consumer wakes once per step, whatever its number of events."""
        batches: dict[str, list[Event]] = {}
        for event in events:
            batches.setdefault(event.request_id, []).append(event)
        for rid, batch in batches.items():
            last = batch[-1].usage is not None
            channel = self._streams.pop(rid, None) if last else self._streams.get(rid)
            if channel is not None:
                channel.send(batch, last=last)
