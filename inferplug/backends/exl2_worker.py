"""The thread that owns an ExLlamaV2DynamicGenerator: every generator call happens here.

Requests come in as commands (add a job, cancel a job); `iterate()` results go back to each
request's asyncio queue as ("tokens", index, ids, [(logprob, top)]) and ("eos", index, info) items.
"""

from __future__ import annotations

import asyncio
import math
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any



@dataclass(eq=False)
class Entry:
    """One choice of one request: an ExLlamaV2DynamicJob and where its results go."""

    job: Any
    index: int
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    done: bool = field(default=False)

    def post(self, *item: Any) -> None:
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)


class GeneratorWorker:
    def __init__(self, generator: Any):
        self.generator = generator
        self.commands: queue.Queue[tuple | None] = queue.Queue()
        self.entries: dict[int, Entry] = {}  # id(job) -> entry
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self._thread = threading.Thread(target=self._run, name="inferplug-exllamav2", daemon=True)
        self._thread.start()

    def add(self, entry: Entry) -> None:
        self.commands.put(("add", entry))

    def cancel(self, entry: Entry) -> Future:
        """Cancel a job; the future is done once the generator freed its pages."""
        done: Future = Future()
        self.commands.put(("cancel", entry, done))
        return done

    def close(self) -> None:
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
                return
            if self.generator.num_remaining_jobs():
                self._step()

    def _apply(self, kind: str, entry: Entry | None = None, done: Future | None = None) -> None:
        if kind == "add" and entry is not None:
            self.entries[id(entry.job)] = entry
            self.generator.enqueue(entry.job)
        elif kind == "cancel" and entry is not None:
            if self.entries.pop(id(entry.job), None) is not None:
                self.generator.cancel(entry.job)  # frees its pages now
            if done is not None:
                done.set_result(None)

    def _step(self) -> None:
        try:
            results = self.generator.iterate()
        except Exception as exc:  # fail the running requests, keep the worker alive
            for entry in list(self.entries.values()):
                entry.post("eos", entry.index, {"eos_reason": "error", "error": f"{type(exc).__name__}: {exc}"})
                self.generator.cancel(entry.job)
            self.entries.clear()
            return
        for r in results:
            entry = self.entries.get(id(r["job"]))
            if entry is None or r["stage"] != "streaming":
                continue
            ids = r["token_ids"][0].tolist() if "token_ids" in r else []
            if ids:
                entry.post("tokens", entry.index, ids, _logprobs(r, ids))
            if r["eos"]:
                self.entries.pop(id(r["job"]), None)
                self.prompt_tokens += r.get("prompt_tokens", 0)
                self.cached_tokens += r.get("cached_tokens", 0)
                entry.post("eos", entry.index, _eos_info(r))


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
