"""Batches concurrent requests into CTranslate2 `generate_batch` calls, streaming their tokens.

Worker threads (one per `inter_threads`) each take every job waiting at that moment, group the
ones whose decoding options agree (CTranslate2 takes options per call, not per example), and run
each group as one batch. The per-token callback, which CTranslate2 calls from its decoding loop,
only sends each example's raw token to its job's channel (the caller's: its output stage runs
there, ctranslate2.py), and stops an example (returns True) once its choice is finished or its job
cancelled.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from inferplug.backends.bridge import EventChannel
from inferplug.errors import CLOSED, BackendUnavailable

Options = tuple[tuple[str, Any], ...]  # generate_batch keyword arguments, hashable to group by


@dataclass(eq=False)
class Job:
    """One request: `n` copies of the same prompt in a batch, one per choice."""

    request_id: str
    start_tokens: list[str]
    n: int
    max_length: int  # new tokens at most; a batch runs to its jobs' largest, each choice stops at its own
    options: Options
    static_prompt: tuple[str, ...] | None
    # its raw items: ("token", index, id, logprob, at) and, last, ("end", reason, error, at) for what is still open
    channel: EventChannel
    stopped: list[bool] = field(init=False)  # per choice: its row stops at its next step
    rows_left: int = field(init=False)  # rows still decoding (read and written by its batch's callback only)

    def __post_init__(self) -> None:
        self.stopped = [False] * self.n
        self.rows_left = self.n

    def group_key(self) -> tuple:
        return (self.options, self.static_prompt)

    def end(self, reason: str, error: str | None = None, items: tuple = ()) -> None:
        """The job is over: what is still open ends with `reason` (the channel drops what comes after)."""
        self.channel.send([*items, ("end", reason, error, time.perf_counter())], last=True)

    def row_over(self, items: list) -> None:
        """One of its rows stopped decoding, sending `items` last; after the last row, the job ends (a choice still
        open then was ended by CTranslate2 at the length)."""
        self.rows_left -= 1
        if self.rows_left:
            self.channel.send(items)
        else:
            self.end("length", items=items)


class Batcher:
    def __init__(self, generator: Any, workers: int, max_batch_size: int):
        self.generator = generator
        self.max_batch_size = max_batch_size
        self.pending: queue.Queue[Job | None] = queue.Queue()
        self.running = 0
        self.batches = 0
        self._lock = threading.Lock()
        self._jobs: dict[str, Job] = {}  # by request id: submitted, its batch not yet over (under _lock)
        self._closed = False  # (under _lock)
        self._threads = [
            threading.Thread(target=self._work, name=f"inferplug-ct2-{i}", daemon=True) for i in range(workers)
        ]
        for t in self._threads:
            t.start()

    def submit(self, job: Job) -> None:
        with self._lock:
            if not self._closed:
                self._jobs[job.request_id] = job
                self.pending.put(job)
                return
        job.channel.send([BackendUnavailable(CLOSED)], last=True)

    def cancel(self, request_id: str) -> None:
        """Stop a request's rows at their next step (or before its batch starts); its stream ends "abort" now.
        Unknown ids are ignored."""
        with self._lock:
            job = self._jobs.pop(request_id, None)
        if job is not None:
            job.stopped[:] = [True] * job.n
            job.end("abort")

    @property
    def waiting(self) -> int:
        return self.pending.qsize()

    def close(self) -> None:
        """Stop the workers: every request not yet over ends now with BackendUnavailable (its rows stop at their next
        step), and one submitted later at once."""
        with self._lock:
            self._closed = True
            jobs, self._jobs = list(self._jobs.values()), {}
        for job in jobs:
            job.stopped[:] = [True] * job.n
            job.channel.send([BackendUnavailable(CLOSED)], last=True)
        for _ in self._threads:
            self.pending.put(None)

    def _work(self) -> None:
        while (first := self.pending.get()) is not None:
            jobs = [first]
            while len(jobs) < self.max_batch_size:  # everything that arrived together
                try:
                    nxt = self.pending.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self.pending.put(None)  # leave the stop signal for this thread's next turn
                    break
                jobs.append(nxt)
            jobs = [j for j in jobs if not all(j.stopped)]  # cancelled while they waited
            for _, group in itertools.groupby(sorted(jobs, key=_sort_key), key=lambda j: j.group_key()):
                self._run_batch(list(group))

    def _run_batch(self, jobs: list[Job]) -> None:
        rows = [(job, index) for job in jobs for index in range(job.n)]
        batch = [job.start_tokens for job, _ in rows]
        leftover = [len(tokens) - min(len(t) for t in batch) for tokens in batch]
        sent = [0] * len(rows)

        def on_step(step: Any) -> bool:  # in CTranslate2's decoding loop: a send, nothing more
            job, index = rows[step.batch_id]
            if job.stopped[index]:  # its choice finished (a stop string, on the consumer's side) or it was cancelled
                job.row_over([])
                return True
            # Prompt positions past the shortest prompt are forced in the decoding loop;
            # skip them should CTranslate2 report them, so only sampled tokens go out.
            if step.step < leftover[step.batch_id]:
                return False
            sent[step.batch_id] += 1
            token = [("token", index, step.token_id, step.log_prob, time.perf_counter())]
            # the batch may run longer than this job's limit: stop its rows here, at once
            limit = sent[step.batch_id] >= job.max_length
            if limit or step.is_last:
                job.row_over(token)
            else:
                job.channel.send(token)
            return limit

        first = jobs[0]
        with self._lock:
            self.running += len(jobs)
            self.batches += 1
        error = None
        try:
            self.generator.generate_batch(
                batch,
                static_prompt=list(first.static_prompt) if first.static_prompt else None,
                include_prompt_in_result=False,
                callback=on_step,
                max_length=max(job.max_length for job in jobs),
                **{k: list(v) if isinstance(v, tuple) else v for k, v in first.options},
            )
        except Exception as exc:  # one failed batch fails its own requests, not the worker
            error = f"{type(exc).__name__}: {exc}"
        finally:
            with self._lock:
                self.running -= len(jobs)
                for job in jobs:
                    self._jobs.pop(job.request_id, None)
            for job in jobs:  # what is still open hit max_length, or failed
                job.end("error" if error else "length", error)


def _sort_key(job: Job) -> str:
    return repr(job.group_key())
