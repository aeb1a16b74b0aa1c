"""The one sync/async bridge: a request's events from the thread that makes them to the caller that reads them.

A producer on any thread (the native engine's step thread, CTranslate2's decoding thread, ExLlamaV2's worker, or
a pump on a backend's own event loop) `send`s events into an EventChannel; one consumer reads them, either a
blocked thread (`consume_sync`) or a coroutine on its own loop (`consume_async`). A producer that hands over raw
tokens gives the channel a stage (`read_with`: the output stage of backends/local_stream.py), which the consumer
runs over them as it takes them, so that detokenizing and stop strings cost the consumer's thread, not the
producer's decoding loop. Wake-ups are coalesced: a consumer is woken once for whatever arrived since it last
looked (one engine step's events, or more), and with `at_end` once when the request ends, for callers that want
only the result. So a batch of chats costs a wake-up per request, not a thread or loop hop per token. A consumer
given a `timeout` waits no longer: past it the request is cancelled and GenerationError raised, whether or not
events were coming.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any

from inferplug.errors import GenerationError


class EventChannel:
    def __init__(self, loop: asyncio.AbstractEventLoop | None = None, *, at_end: bool = False):
        """loop: the consuming coroutine's loop (None: a consuming thread). at_end: wake only once it has ended."""
        self._loop, self._at_end = loop, at_end
        self._lock = threading.Lock()
        self._items: list[Any] = []
        self._ended = False
        self._notified = False
        self._ready: threading.Event | asyncio.Event = threading.Event() if loop is None else asyncio.Event()
        self._stage: Callable[[list[Any]], tuple[list[Any], bool]] | None = None

    def read_with(self, stage: Callable[[list[Any]], tuple[list[Any], bool]], *, early: bool) -> None:
        """Run stage(items) -> (events, done) on the consumer's side over what the producer sends; done ends the
        request before the producer does (then, as for a consumer that leaves, it is cancelled). early: the stage
        may end it so (a stop string), so the consumer wakes for each send even at_end, to stop it at once.
        Set by the producer before its first send."""
        self._stage = stage
        self._at_end = self._at_end and not early

    # --- producer side, any thread -------------------------------------------------
    def send(self, items: list[Any], *, last: bool = False) -> None:
        """Events (or one exception, re-raised in the consumer); `last` ends the request."""
        with self._lock:
            if self._ended:
                return
            self._items += items
            self._ended = last
            if self._notified or (self._at_end and not last):
                return
            self._notified = True
        if self._loop is None:
            self._ready.set()
            return
        try:
            self._loop.call_soon_threadsafe(self._ready.set)
        except RuntimeError:  # the consumer's loop is closed: nobody is listening any more
            pass

    # --- consumer side ---------------------------------------------------------------
    def _take(self) -> tuple[list[Any], bool]:
        """What was sent since the last take (through the stage, if there is one) and whether the request ended."""
        with self._lock:
            items, self._items = self._items, []
            self._notified = False
            self._ready.clear()
            ended = self._ended
        if self._stage is None:
            return items, ended
        try:
            events, done = self._stage(items)
        except Exception as exc:  # noqa: BLE001 - a fault of the stage fails this request alone (then cancelled)
            return [exc], True
        return events, ended or done


def _unpack(items: list[Any]) -> Iterator[Any]:
    for item in items:
        if isinstance(item, BaseException):
            raise item
        yield item


def consume_sync(submit: Callable[[EventChannel], None], cancel: Callable[[], None], *,
                 at_end: bool = False, timeout: float | None = None) -> Iterator[Any]:
    """Submit (on first iteration) and read the events in this thread; leaving before the end calls cancel()."""
    channel = EventChannel(at_end=at_end)
    deadline = None if timeout is None else time.monotonic() + timeout
    submit(channel)
    try:
        while True:
            _wait_in_thread(channel, deadline, timeout)
            items, ended = channel._take()
            for item in items:
                if isinstance(item, BaseException):
                    raise item
                yield item
            if ended:
                return
    finally:
        if not channel._ended:  # the producer is not done with it: cancel what it still holds
            cancel()


def consume_all_sync(submits: list[Callable[[EventChannel], None]], cancels: list[Callable[[], None]], *,
                     timeout: float | None = None) -> list[Iterable[Any]]:
    """Submit every request at once (they share the engine's steps), then wait in this thread for each to end (one
    wake-up each): each one's events, as a list, or for one that failed an iterator that raises its error where it
    comes. Leaving early (or past `timeout`: GenerationError) cancels those not ended."""
    channels = [EventChannel(at_end=True) for _ in submits]
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        for submit, channel in zip(submits, channels):
            submit(channel)
        ended = []
        for channel in channels:
            items, done = [], False
            while not done:  # one wake-up, unless its stage must look at its tokens as they come
                _wait_in_thread(channel, deadline, timeout)
                taken, done = channel._take()
                items += taken
            failed = any(isinstance(item, BaseException) for item in items)
            ended.append(_unpack(items) if failed else items)
        return ended
    finally:
        for channel, cancel in zip(channels, cancels):
            if not channel._ended:
                cancel()


async def consume_async(submit: Callable[[EventChannel], None], cancel: Callable[[], None], *,
                        at_end: bool = False, timeout: float | None = None) -> AsyncIterator[Any]:
    """Submit (on first iteration) and read the events on the running loop; leaving before the end calls cancel()
    in a worker thread."""
    channel = EventChannel(asyncio.get_running_loop(), at_end=at_end)
    deadline = None if timeout is None else time.monotonic() + timeout
    submit(channel)
    try:
        while True:
            try:  # wait_for raises at once for a deadline already past, as events come or not
                await asyncio.wait_for(channel._ready.wait(), None if deadline is None else deadline - time.monotonic())
            except TimeoutError:
                raise _timed_out(timeout) from None
            items, ended = channel._take()
            for item in items:
                if isinstance(item, BaseException):
                    raise item
                yield item
            if ended:
                return
    finally:
        if not channel._ended:
            await asyncio.to_thread(cancel)


def _wait_in_thread(channel: EventChannel, deadline: float | None, timeout: float | None) -> None:
    """Block this thread until the channel has news; past `deadline` GenerationError, even as events come."""
    left = None if deadline is None else deadline - time.monotonic()
    if (left is not None and left <= 0) or not channel._ready.wait(left):
        raise _timed_out(timeout)


def _timed_out(timeout: float | None) -> GenerationError:
    return GenerationError(f"the call ran past timeout={timeout}s and was aborted; raise timeout or lower max_tokens")
