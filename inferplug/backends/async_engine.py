"""AsyncEngine: the LLMEngine step loop in a background thread, its events handed out through EventChannels.

Callers never wait for the engine: `submit` runs the request's prompt stage (stages/prompt.py: render, tokenize,
check, place the documents; and its JSON schema compiled) off the step thread, so a huge prompt, a long history or a
large schema costs its own request time, not a step of every stream. A caller on an event loop (the server) hands it
to the prompt workers (round-robin by client, one worker per client at a time: PromptQueue, below) and returns; a
thread with no loop, which waits for the answer anyway, runs it itself. Once prepared the request is queued, and
the step thread adds queued requests between steps (a bad one ends its channel with the RequestError)
and sends each step's events to their channels, one send per channel per step. One lock guards the
engine: the step thread holds it for a step's scheduling, model and sampling (LLMEngine.step_tokens), `abort_now`
takes it between steps. The output stage's work (detokenizing, stop strings, the reasoning split) runs after, under
a lock of its own, not the engine's; a stop string it finds ends its sequence before the events go out, so a
request's last event still comes with its blocks back. `stats` never waits: it reads
the snapshot the step thread publishes after each step. If the step thread dies, every request still open and
every later one fails with BackendUnavailable, and `failure` says why (the server's /health reports it).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

from inferplug.backends.bridge import EventChannel, consume_async
from inferplug.engine.guided import compile_json_schema
from inferplug.engine.llm_engine import LLMEngine
from inferplug.errors import CLOSED, BackendUnavailable
from inferplug.stages.prompt import EncodedPrompt, encode_prompt
from inferplug.types import Event, Request, Usage

log = logging.getLogger(__name__)

PROMPT_WORKERS = 2  # tokenizing and compiling are CPU work: a few threads, started once, whatever the load


class PromptQueue:
    """The prompt workers' queue: requests taken round-robin by client (Request.client: the server's tenant or remote
    address), and each client's one at a time. A client sending schemas that take seconds to compile keeps one worker
    busy, never all of them, and another client's prompt is taken by the next free worker, not after that queue."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._waiting: dict[str | None, deque[Request]] = {}  # by client, in turn order: the next served first
        self._busy: set[str | None] = set()  # the clients a worker prepares a request of
        self._closed = False

    def put(self, request: Request) -> None:
        with self._changed:
            self._waiting.setdefault(request.client, deque()).append(request)
            self._changed.notify()

    def take(self) -> Request | None:
        """The next request of the first client in turn with no request being prepared; None once closed and empty
        (closing, what is queued is still handed out, whoever is busy: its stream ends with BackendUnavailable)."""
        with self._changed:
            while True:
                # requests of no client (library calls, the integrations) are not shared out: any free worker
                ready = [c for c in self._waiting if c is None or self._closed or c not in self._busy][:1]
                if ready:
                    queued = self._waiting.pop(ready[0])
                    request = queued.popleft()
                    if queued:  # its turn comes again after every other client's
                        self._waiting[ready[0]] = queued
                    self._busy.add(ready[0])
                    return request
                if self._closed:
                    return None
                self._changed.wait()

    def discard(self, request: Request) -> None:
        """Drop `request` if it still waits (aborted before a worker took it): an aborted prompt holds no memory."""
        with self._changed:
            kept = deque(r for r in self._waiting.get(request.client, ()) if r is not request)
            if kept:
                self._waiting[request.client] = kept
            else:
                self._waiting.pop(request.client, None)

    def done(self, request: Request) -> None:
        """The worker that took `request` is done with it: its client's next request may be taken."""
        with self._changed:
            self._busy.discard(request.client)
            self._changed.notify()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()


class AsyncEngine:
    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self._lock = threading.Lock()  # the engine's: scheduling, blocks, the model
        self._output_lock = threading.Lock()  # the output stage's (choices' text); taken after _lock, never before
        self._wake = threading.Event()
        self._inbox: deque[tuple[Request, EventChannel, EncodedPrompt]] = deque()  # with its prompt stage's result
        self._preparing: dict[str, tuple[Request, EventChannel]] = {}  # with a prompt worker (under _inbox_lock)
        self._inbox_lock = threading.Lock()  # never held for a step: submit does not wait for the engine
        self._streams: dict[str, EventChannel] = {}
        self._open: set[str] = set()  # submitted, not yet ended (under _inbox_lock): what an abort must wait for
        self._closed = False
        self.failure: str | None = None  # why the step thread stopped, when it died
        self._snapshot = engine.stats()
        self._prompts = PromptQueue()  # for the prompt workers
        self._workers = [threading.Thread(target=self._prepare_prompts, name=f"inferplug-prompt-{i}", daemon=True)
                         for i in range(PROMPT_WORKERS)]
        self._thread = threading.Thread(target=self._loop, name="inferplug-engine", daemon=True)
        for thread in (*self._workers, self._thread):
            thread.start()

    def submit(self, request: Request, channel: EventChannel) -> None:
        """Start the request; its events, or the RequestError that refuses it, go to channel. A caller on a loop (the
        server) must not block, so a prompt worker runs its prompt stage; a thread with no loop waits for the answer
        anyway, so it runs the stage itself: no hand-off, and nothing to share out (those callers have no client).
        Either way the request is open from here: an abort while its prompt is prepared drops it."""
        try:
            asyncio.get_running_loop()
            here = False
        except RuntimeError:  # no loop here: this thread may block
            here = True
        with self._inbox_lock:
            closed = self._closed
            if not closed:
                self._open.add(request.request_id)
                self._preparing[request.request_id] = (request, channel)
                if not here:  # under the lock: once closed, no request goes to the workers
                    self._prompts.put(request)
        if closed:
            channel.send([BackendUnavailable(self.failure or CLOSED)], last=True)
            return
        if here:
            try:
                prompt, error = self._prepare(request), None
            except Exception as exc:  # noqa: BLE001 - a bad request fails alone
                prompt, error = None, exc
            self._prepared(request, prompt, error)

    def _prepare(self, request: Request) -> EncodedPrompt:
        """The prompt stage: the prompt's ids, and its schema compiled so that the engine's own compile is a cache hit."""
        engine = self.engine
        prompt = encode_prompt(engine.tokenizer, engine.render_chat, request, engine.max_model_len)
        if request.params.json_schema is not None:
            compile_json_schema(engine.tokenizer, request.params.json_schema)
        return prompt

    def _prepare_prompts(self) -> None:
        """A prompt worker: each request's prompt stage (_prepare), unless it was aborted or the engine closed while
        it waited."""
        while (request := self._prompts.take()) is not None:
            prompt = error = None
            try:
                with self._inbox_lock:
                    wanted = request.request_id in self._preparing and not self._closed
                if wanted:
                    prompt = self._prepare(request)
            except Exception as exc:  # noqa: BLE001 - a bad request fails alone
                error = exc
            finally:
                self._prompts.done(request)
            self._prepared(request, prompt, error)

    def _prepared(self, request: Request, prompt: EncodedPrompt | None, error: Exception | None) -> None:
        """A request's prompt stage is over: queued for the step thread, or its stream ended with the RequestError
        (or BackendUnavailable once closed); nothing, if it was aborted meanwhile."""
        with self._inbox_lock:
            entry = self._preparing.pop(request.request_id, None)
            if entry is None:
                return  # aborted (its stream already ended) while it was prepared
            if error is None and not self._closed:
                self._inbox.append((request, entry[1], prompt))
                self._wake.set()
                return
            self._open.discard(request.request_id)
        entry[1].send([error or BackendUnavailable(self.failure or CLOSED)], last=True)

    def generate(self, request: Request) -> AsyncIterator[Event]:
        """Stream the request's events; the last one carries usage. RequestError comes before any event."""
        return consume_async(partial(self.submit, request), partial(self.abort_now, request.request_id))

    async def abort(self, request_id: str) -> None:
        """Cancel a request now: its blocks go back to the pool before this returns."""
        if request_id in self._open:  # one that ended needs no thread
            await asyncio.to_thread(self.abort_now, request_id)

    def abort_now(self, request_id: str) -> None:
        """abort() for a thread that may block: it waits for the step in flight, unless the request has ended or
        is still queued (then it is dropped from the queue at once, and its stream ends with "abort")."""
        with self._inbox_lock:
            if request_id not in self._open:
                return
            queued = [item[:2] for item in self._inbox if item[0].request_id == request_id]
            if queued:
                self._inbox = deque(item for item in self._inbox if item[0].request_id != request_id)
            elif request_id in self._preparing:
                queued = [self._preparing.pop(request_id)]
                self._prompts.discard(queued[0][0])
            if queued:
                self._open.discard(request_id)
        if queued:
            request, channel = queued[0]
            channel.send(_aborted_before_start(request), last=True)
            return
        with self._lock, self._output_lock:
            events = self.engine.abort(request_id)
            self._snapshot = self.engine.stats()
        self._dispatch(events)

    def stats(self) -> dict[str, Any]:
        """The engine's stats as of its last step or abort; never waits for a step in flight."""
        return dict(self._snapshot)

    def evict_documents(self, docs: list[Any] | None, salt: str | None) -> int:
        """The document cache's evict (engine/doc_cache.py), between steps."""
        with self._lock:
            cache = self.engine.doc_cache
            dropped = cache.evict(docs, salt) if cache is not None else 0
            self._snapshot = self.engine.stats()
            return dropped

    def close(self) -> None:
        """Stop the step thread; open streams end with BackendUnavailable and their blocks are freed."""
        with self._lock:
            with self._inbox_lock:
                self._closed = True
            self._admit()
            self._fail_all(BackendUnavailable("the backend was closed while this request ran; create a new backend"))
        self._wake.set()
        self._thread.join(timeout=30)
        self._prompts.close()  # what they still prepare ends with BackendUnavailable (closed)
        for thread in self._workers:
            thread.join(timeout=30)
        self.engine.close()  # after the step thread: a tensor-parallel engine's workers stop

    # --- the engine thread's side (the lock held) ------------------------------------
    def _admit(self) -> None:
        with self._inbox_lock:  # taken whole: abort_now rebuilds the inbox under this lock, never mid-pop
            queued, self._inbox = self._inbox, deque()
        for request, channel, prompt in queued:
            try:
                self.engine.add_request(request, prompt)
            except Exception as exc:  # noqa: BLE001 - a bad request (RequestError) fails alone, before any event
                with self._inbox_lock:
                    self._open.discard(request.request_id)
                channel.send([exc], last=True)
                continue
            self._streams[request.request_id] = channel

    def _loop(self) -> None:
        try:
            self._steps()
        except BaseException as exc:  # noqa: BLE001 - the step thread is dying: nobody may wait on it
            log.critical("the engine's step thread stopped", exc_info=exc)
            self._die(BackendUnavailable(f"the engine's step thread stopped ({type(exc).__name__}); restart the "
                                         "server (its log has the details)"))

    def _die(self, error: BackendUnavailable) -> None:
        """Fail what is queued and running, and refuse what comes later, with `error`."""
        with self._lock:
            with self._inbox_lock:
                self.failure, self._closed = str(error), True
                queued, self._inbox = list(self._inbox), deque()
                self._open.difference_update(item[0].request_id for item in queued)
            for _, channel, _ in queued:
                channel.send([error], last=True)
            self._fail_all(error)

    def _steps(self) -> None:
        engine = self.engine
        while not self._closed:
            self._wake.clear()
            with self._lock:
                admitting = bool(self._inbox)
                if admitting:
                    self._admit()
                busy, work = bool(engine.requests), []
                if busy:
                    try:
                        work = engine.step_tokens()
                    except Exception as exc:  # noqa: BLE001 - an engine bug must not hang every stream
                        self._fail_all(exc)
                if admitting or busy:  # else nothing changed since the last snapshot
                    self._snapshot = engine.stats()
            if not busy:
                self._wake.wait()
            elif not work:
                time.sleep(0)  # let abort/stats take the lock between steps
            else:  # the step's output-stage work, off the engine's lock
                with self._output_lock:
                    events = engine.outputs(work)
                if engine.text_stopped:  # the sequences a stop string ended end before their events go out
                    with self._lock:
                        engine.end_text_stopped()
                        self._snapshot = engine.stats()
                self._dispatch(events)

    def _fail_all(self, exc: BaseException) -> None:
        """Abort every request (its blocks back in the pool) and end every open stream with exc (the engine's
        lock held)."""
        with self._output_lock:
            for rid in list(self.engine.requests):
                try:
                    self.engine.abort(rid)
                except Exception:  # noqa: BLE001 - one broken request must not keep the others' streams open
                    log.exception("aborting request %s failed", rid)
        with self._inbox_lock:  # as _dispatch takes its channels: a dispatch on another thread never sees it half done
            streams, self._streams = self._streams, {}
            self._open.difference_update(streams)
        for channel in streams.values():
            channel.send([exc], last=True)
        self._snapshot = self.engine.stats()

    def _dispatch(self, events: list[Event]) -> None:
        """One send per channel: a consumer wakes once per step, whatever its number of events. The channels are
        taken, and the requests that end closed, under one take of the inbox lock (the step thread and an abort's
        thread both dispatch, and a close ends the streams left)."""
        batches: dict[str, list[Event]] = {}
        for event in events:
            batches.setdefault(event.request_id, []).append(event)
        sends = []
        with self._inbox_lock:
            for rid, batch in batches.items():
                last = batch[-1].usage is not None
                if last:
                    self._open.discard(rid)
                sends.append((self._streams.pop(rid, None) if last else self._streams.get(rid), batch, last))
        for channel, batch, last in sends:
            if channel is not None:
                channel.send(batch, last=last)


def _aborted_before_start(request: Request) -> list[Event]:
    """The events of a request aborted while still queued: each choice ends "abort", nothing computed."""
    choices = 1 if request.params.use_beam_search else request.params.n
    events = [Event(request.request_id, index=i, finish_reason="abort") for i in range(choices)]
    events[-1].usage = Usage()
    return events
