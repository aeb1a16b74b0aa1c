"""The one sync/async bridge: a request's events from the thread that makes them to the caller that reads them.

A producer on any thread (the native engine's step thread, CTranslate2's decoding thread, ExLlamaV2's worker, or
a pump on a backend's own event loop) `send`s events into an EventChannel; one consumer reads them, either a
blocked thread (`consume_sync`) or a coroutine on its own loop (`consume_async`). A producer that hands over raw
tokens gives the channel a stage (`read_with`: the output stage of backends/local_stream.py), which the consumer
runs over them as it takes them, so that detokenizing and stop strings cost the consumer's thread, not the
producer's decoding loop. Wake-ups are coalesced: a consumer is woken once for whatever arrived since it last
looked (one engine step's events, or more), and with `at_end` once when the request ends, for callers that want
only the result. So a batch of chats costs a wake-up per request, not a thread or loop hop per token. A waking
is the channel's `notify(channel)`: a consuming thread's is a queue's put, so a thread waiting for a batch wakes
for whichever channel has news first; a coroutine's sets an event on its loop. A consumer given a `timeout` waits
no longer: past it the request is cancelled and GenerationError raised, whether or not events were coming.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from functools import partial
from typing import Any

from inferplug.errors import GenerationError


class EventChannel:
    def __init__(self, notify: Callable[[EventChannel], None], *, at_end: bool = False):
        """notify(channel) wakes the consumer, from the producer's thread, once for whatever arrived since the
        consumer last took. at_end: wake it only once the request has ended."""
        self._notify, self._at_end = notify, at_end
        self._lock = threading.Lock()
        self._items: list[Any] = []
        self._ended = False
        self._notified = False
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
        self._notify(self)

    # --- consumer side ---------------------------------------------------------------
    def _take(self) -> tuple[list[Any], bool]:
        """What was sent since the last take (through the stage, if there is one) and whether the request ended."""
        with self._lock:
            items, self._items = self._items, []
            self._notified = False
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
    news: queue.SimpleQueue[EventChannel] = queue.SimpleQueue()
    channel = EventChannel(news.put, at_end=at_end)
    deadline = None if timeout is None else time.monotonic() + timeout
    submit(channel)
    try:
        while True:
            _next_news(news, deadline, timeout)
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
    """Submit every request at once (they share the engine's steps), then wait in this thread until each has ended
    (one wake-up each, in whatever order they end): each one's events, as a list, or for one that failed an iterator
    that raises its error where it comes. A channel whose stage must look at its tokens as they come (a stop string)
    is read at each send, whichever request the batch waits for. Leaving early (or past `timeout`: GenerationError)
    cancels those not ended."""
    news: queue.SimpleQueue[EventChannel] = queue.SimpleQueue()
    channels = [EventChannel(news.put, at_end=True) for _ in submits]
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        for submit, channel in zip(submits, channels):
            submit(channel)
        items: dict[EventChannel, list[Any]] = {channel: [] for channel in channels}
        open_channels = set(channels)
        while open_channels:
            channel = _next_news(news, deadline, timeout)
            if channel in open_channels:  # a stage may have ended a request its producer still sends to
                taken, done = channel._take()
                items[channel] += taken
                if done:
                    open_channels.discard(channel)
        return [_unpack(got) if any(isinstance(item, BaseException) for item in got) else got
                for got in items.values()]
    finally:
        for channel, cancel in zip(channels, cancels):
            if not channel._ended:
                cancel()


async def consume_async(submit: Callable[[EventChannel], None], cancel: Callable[[], None], *,
                        at_end: bool = False, timeout: float | None = None) -> AsyncIterator[Any]:
    """Submit (on first iteration) and read the events on the running loop; leaving before the end calls cancel()
    in a worker thread."""
    ready = asyncio.Event()
    channel = EventChannel(partial(_wake_on, asyncio.get_running_loop(), ready), at_end=at_end)
    deadline = None if timeout is None else time.monotonic() + timeout
    submit(channel)
    try:
        while True:
            try:  # wait_for raises at once for a deadline already past, as events come or not
                await asyncio.wait_for(ready.wait(), None if deadline is None else deadline - time.monotonic())
            except TimeoutError:
                raise _timed_out(timeout) from None
            ready.clear()  # before the take: a send after it wakes this loop again
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


def _wake_on(loop: asyncio.AbstractEventLoop, ready: asyncio.Event, channel: EventChannel) -> None:
    """A coroutine consumer's notify: set its event on its own loop."""
    try:
        loop.call_soon_threadsafe(ready.set)
    except RuntimeError:  # the consumer's loop is closed: nobody is listening any more
        pass


def _next_news(news: queue.SimpleQueue[EventChannel], deadline: float | None,
               timeout: float | None) -> EventChannel:
    """Block this thread until a channel has news, and name it; past `deadline` GenerationError, even as events
    come."""
    left = None if deadline is None else deadline - time.monotonic()
    if left is not None and left <= 0:
        raise _timed_out(timeout)
    try:
        return news.get(timeout=left)
    except queue.Empty:
        raise _timed_out(timeout) from None


def _timed_out(timeout: float | None) -> GenerationError:
    return GenerationError(f"the call ran past timeout={timeout}s and was aborted; raise timeout or lower max_tokens")
