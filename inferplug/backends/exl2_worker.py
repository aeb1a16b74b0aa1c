"""The thread that owns an ExLlamaV2DynamicGenerator: every generator call happens here.

Requests come in as commands (add a request's jobs, cancel them); `iterate()` results go straight to each
request's channel (the caller's: its output stage runs there, exllamav2.py), one send per request per step, as
raw items: ("tokens", index, [(id, logprob, top)], at), ("eos", index, info, at) and ("abort", index, None, at);
the last once none of the request's jobs runs, their pages freed.
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import threading
import time
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any

from inferplug.backends.bridge import EventChannel
from inferplug.errors import CLOSED, BackendUnavailable, GenerationError

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Submitted:
    """One request: an ExLlamaV2DynamicJob per choice, and the channel their results go to."""

    request_id: str
    jobs: list[Any]
    channel: EventChannel

    def __post_init__(self) -> None:
        self.running = set(range(len(self.jobs)))  # the choices whose job the generator still has (the worker's)


class GeneratorWorker:
    def __init__(self, generator: Any):
        self.generator = generator
        self.commands: queue.Queue[tuple | None] = queue.Queue()
        self.requests: dict[str, Submitted] = {}  # the worker thread's, as `jobs`
        self.jobs: dict[int, tuple[Submitted, int]] = {}  # id(job) -> its request and choice
        self.open: set[str] = set()  # the ids of requests added and not yet ended (any thread reads it)
        self._lock = threading.Lock()  # add, cancel and close: no command is put once closed
        self._closed = False
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self._thread = threading.Thread(target=self._run, name="inferplug-exllamav2", daemon=True)
        self._thread.start()

    def add(self, request: Submitted) -> None:
        with self._lock:
            if not self._closed:
                self.open.add(request.request_id)
                self.commands.put(("add", request))
                return
        request.channel.send([BackendUnavailable(CLOSED)], last=True)

    def cancel(self, request_id: str, index: int | None = None) -> Future:
        """Cancel a request's jobs (or choice `index`'s only); the future is done once the generator freed their
        pages. Unknown ids and ended jobs are ignored."""
        done: Future = Future()
        with self._lock:
            if request_id in self.open and not self._closed:
                self.commands.put(("cancel", request_id, index, done))
                return done
        done.set_result(None)  # ended (the usual case for the server's abort after a response), or closed: no step
        return done

    def close(self) -> None:
        """Stop the worker: its open requests end with BackendUnavailable, their pages freed, and so does one added
        later; a cancel asked later returns at once."""
        with self._lock:  # after this, add and cancel put no command
            self._closed = True
            self.commands.put(None)
        self._thread.join(timeout=30)

    def stats(self) -> dict[str, Any]:
        g = self.generator
        return {
            "running": len(g.active_jobs),
            "waiting": len(g.pending_jobs),
            "kv_blocks_total": g.max_pages,
            "kv_blocks_used": len(g.referenced_pages),
            "kv_block_size": g.page_size,
            "prefix_hit_rate": self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0,
        }

    # --- the worker thread ---------------------------------------------------------
    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # noqa: BLE001 - the worker is dying: no stream may wait on it
            log.critical("the ExLlamaV2 worker stopped", exc_info=exc)
            self._die(BackendUnavailable(f"the ExLlamaV2 worker stopped ({type(exc).__name__}: {exc}); create a new "
                                         "backend (the log has the details)"))

    def _die(self, error: BackendUnavailable) -> None:
        """The worker is dying: later commands are refused as after close, and every open request and every command
        still queued ends now (a request with `error`, a cancel at once)."""
        with self._lock:
            self._closed = True
        self._end_all(error)
        while not self.commands.empty():
            command = self.commands.get_nowait()
            if command is not None and command[0] == "add":
                self.open.discard(command[1].request_id)
                command[1].channel.send([error], last=True)
            elif command is not None and command[0] == "cancel":
                _resolve(command[3])

    def _serve(self) -> None:
        while True:
            idle = self.generator.num_remaining_jobs() == 0
            try:
                command = self.commands.get(block=idle)
            except queue.Empty:
                command = ("none",)
            while command is not None:
                self._apply(*command)
                try:  # take everything that arrived meanwhile
                    command = self.commands.get_nowait()
                except queue.Empty:
                    break
            if command is None:
                self._end_all(BackendUnavailable(CLOSED))
                return
            if self.generator.num_remaining_jobs():
                self._step()

    def _apply(self, kind: str, *args: Any) -> None:
        if kind == "add":
            (request,) = args
            self.requests[request.request_id] = request
            for index, job in enumerate(request.jobs):
                try:
                    self.generator.enqueue(job)
                except Exception as exc:  # noqa: BLE001 - the generator refuses this request: it fails alone
                    self._refused(request, index, exc)
                    return
                self.jobs[id(job)] = (request, index)
        elif kind == "cancel":
            request_id, index, done = args
            request = self.requests.get(request_id)
            try:
                if request is not None:
                    cancelled = [i for i in sorted(request.running) if index in (None, i)]
                    self._cancel(request, cancelled, [("abort", i, None, time.perf_counter()) for i in cancelled])
            finally:  # a cancel that breaks the generator (the worker dies) must not leave its caller waiting
                _resolve(done)

    def _refused(self, request: Submitted, index: int, exc: Exception) -> None:
        """enqueue raised for the request's job `index`: its jobs already queued are cancelled (pages freed) and the
        request ends with the generator's reason; the worker goes on."""
        for queued in request.jobs[:index]:
            self.generator.cancel(queued)
        error = GenerationError(f"ExLlamaV2 refused the request ({type(exc).__name__}: {exc}); check its prompt "
                                "length against the profile's context and its sampling options")
        self._send(request, [error], sorted(request.running))

    def _end_all(self, error: BackendUnavailable) -> None:
        """The worker stops (closed, or dying): every request still open ends with `error`, its jobs' pages freed."""
        for request in list(self.requests.values()):
            try:
                self._cancel(request, sorted(request.running), [error])
            except Exception:  # noqa: BLE001 - the generator may be what broke: end the stream anyway
                log.exception("cancelling the jobs of request %s failed", request.request_id)
                self._send(request, [error], sorted(request.running))

    def _cancel(self, request: Submitted, choices: list[int], items: list) -> None:
        """The generator drops these choices' jobs (their pages freed now); the request gets `items`, its last once
        none of its jobs runs."""
        for index in choices:
            self.generator.cancel(request.jobs[index])
        self._send(request, items, choices)

    def _send(self, request: Submitted, items: list[tuple], ended: list[int]) -> None:
        """A request's items of this step; `ended`: its choices whose job the generator no longer has."""
        for index in ended:
            request.running.discard(index)
            self.jobs.pop(id(request.jobs[index]), None)
        if not request.running:
            del self.requests[request.request_id]
            self.open.discard(request.request_id)
        if items or not request.running:
            request.channel.send(items, last=not request.running)

    def _step(self) -> None:
        try:
            results = self.generator.iterate()
        except Exception as exc:  # fail the running requests, keep the worker alive
            info = {"eos_reason": "error", "error": f"{type(exc).__name__}: {exc}"}
            for request in list(self.requests.values()):
                running = sorted(request.running)
                self._cancel(request, running, [("eos", index, info, time.perf_counter()) for index in running])
            return
        at = time.perf_counter()
        items: dict[Submitted, list[tuple]] = {}
        ended: dict[Submitted, list[int]] = {}
        for r in results:
            found = self.jobs.get(id(r["job"]))
            if found is None or r["stage"] != "streaming":
                continue
            request, index = found
            mine = items.setdefault(request, [])
            ids = r["token_ids"][0].tolist() if "token_ids" in r else []
            if ids:
                mine.append(("tokens", index, [(t, *lp) for t, lp in zip(ids, _logprobs(r, ids))], at))
            if r["eos"]:
                self.prompt_tokens += r.get("prompt_tokens", 0)
                self.cached_tokens += r.get("cached_tokens", 0)
                mine.append(("eos", index, _eos_info(r), at))
                ended.setdefault(request, []).append(index)
        for request, mine in items.items():  # one send per request per step
            self._send(request, mine, ended.get(request, []))


def _resolve(done: Future) -> None:
    """A cancel's future, done. Its caller may have given up on it: an asyncio task awaiting it through
    wrap_future (the server's abort) cancels it when the task is cancelled, and a cancelled future refuses a result."""
    with contextlib.suppress(InvalidStateError):
        done.set_result(None)


def _logprobs(r: dict[str, Any], ids: list[int]) -> list[tuple[float | None, list]]:
    """(logprob, top alternatives as (id, logprob)) per token; ExLlamaV2 reports probabilities."""
    if "token_probs" not in r:
        return [(None, [])] * len(ids)
    probs = r["token_probs"][0].tolist()
    top_ids = r["top_k_tokens"][0].tolist() if "top_k_tokens" in r else [[] for _ in ids]
    top_probs = r["top_k_probs"][0].tolist() if "top_k_probs" in r else [[] for _ in ids]
    return [(_log(p), [(k, _log(kp)) for k, kp in zip(ks, kps)])
            for p, ks, kps in zip(probs, top_ids, top_probs)]


def _log(p: float) -> float:
    return math.log(p) if p > 0 else -math.inf


def _eos_info(r: dict[str, Any]) -> dict[str, Any]:
    """What ended the job; tokens it still held (the stop token among them) are passed on."""
    held = r.get("held", {})
    return {
        "eos_reason": r.get("eos_reason"),
        "stop_token": r.get("eos_triggering_token_id"),
        "held_ids": held["token_ids"][0].tolist() if "token_ids" in held else [],
        "prompt_tokens": r.get("prompt_tokens", 0),
        "cached_tokens": r.get("cached_tokens", 0),
    }
