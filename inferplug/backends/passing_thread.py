"""Run a call in a thread that then ends, so that the OpenMP pool it makes goes with it.

OpenMP (libgomp, which torch, and llama.cpp's ggml where it is in the same process, share) keeps a pool of workers
for every thread that ran a parallel region, until that thread ends. Once those pools hold more workers than the
host has CPUs, every worker spins only 100 times before it sleeps, so each parallel region waits on a futex
wake-up. On 2 cores, loading a model in the caller's thread left it such a pool, and each parallel region of the
engine's step thread cost 40 us instead of 7: one-stream SmolLM2 decode ran at 85 tok/s instead of 230. Work done
in a passing thread leaves the step thread's pool the only one (a caller's own torch work in its thread still makes
one: an app that embeds documents with torch in its main thread can do that in a passing thread too).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def in_a_passing_thread(call: Callable[[], T], name: str = "inferplug-passing") -> T:
    """call()'s result (or its exception), computed in a thread that has ended when this returns."""
    results: list[T] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            results.append(call())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            failed.append(exc)

    thread = threading.Thread(target=run, name=name, daemon=True)  # daemon: Ctrl-C in the caller still exits
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return results[0]
