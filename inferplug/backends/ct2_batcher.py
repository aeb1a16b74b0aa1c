"""Batches concurrent requests into CTranslate2 `generate_batch` calls, streaming their tokens.

Worker threads (one per `inter_threads`) each take every job waiting at that moment, group the
ones whose decoding options agree (CTranslate2 takes options per call, not per example), and run
each group as one batch. The per-token callback streams every example's tokens back to its
job's asyncio queue, and stops an example (returns True) once its job is cancelled or finished.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
from dataclasses import dataclass, field
from typing import Any

Options = tuple[tuple[str, Any], ...]  # generate_batch keyword arguments, hashable to group by


@dataclass(eq=False)
class Job:
    """One request: `n` copies of the same prompt in a batch, one per choice."""

    start_tokens: list[str]
    n: int
    max_length: int  # new tokens at most; a batch runs to its jobs' largest, each choice stops at its own
    options: Options
    static_prompt: tuple[str, ...] | None
    loop: asyncio.AbstractEventLoop
    # ("token", index, (id, logprob)), ("abort", None, None) or ("end", None, error)
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    stopped: list[bool] = field(default_factory=list)  # per choice: the consumer has finished it

    def __post_init__(self) -> None:
        self.stopped = [False] * self.n
        self.cancelled = threading.Event()

    def group_key(self) -> tuple:
        return (self.options, self.static_prompt)

    def post(self, *item: Any) -> None:
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)


class Batcher:
    def __init__(self, generator: Any, workers: int, max_batch_size: int):
        self.generator = generator
        self.max_batch_size = max_batch_size
        self.pending: queue.Queue[Job | None] = queue.Queue()
        self.running = 0
        self.batches = 0
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._work, name=f"inferplug-ct2-{i}", daemon=True) for i in range(workers)
        ]
        for t in self._threads:
            t.start()

    def submit(self, job: Job) -> None:
        self.pending.put(job)

    @property
    def waiting(self) -> int:
        return self.pending.qsize()

    def close(self) -> None:
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
            jobs = [j for j in jobs if not j.cancelled.is_set()]
            for _, group in itertools.groupby(sorted(jobs, key=_sort_key), key=lambda j: j.group_key()):
                self._run_batch(list(group))

    def _run_batch(self, jobs: list[Job]) -> None:
        rows = [(job, index) for job in jobs for index in range(job.n)]
        batch = [job.start_tokens for job, _ in rows]
        leftover = [len(tokens) - min(len(t) for t in batch) for tokens in batch]
        sent = [0] * len(rows)

        def on_step(step: Any) -> bool:
            job, index = rows[step.batch_id]
            if job.cancelled.is_set() or job.stopped[index]:
                return True
            # Prompt positions past the shortest prompt are forced in the decoding loop;
            # skip them should CTranslate2 report them, so only sampled tokens go out.
            if step.step >= leftover[step.batch_id]:
                job.post("token", index, (step.token_id, step.log_prob))
                sent[step.batch_id] += 1
            # the batch may run longer than this job's limit: stop its rows here, at once
            return sent[step.batch_id] >= job.max_length

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
                job.post("end", None, error)


def _sort_key(job: Job) -> str:
    return repr(job.group_key())
