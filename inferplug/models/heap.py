"""glibc's heap at load and at run time.

A load keeps its freed scratch out of its RSS. glibc keeps what a process frees inside its heap instead of handing
it back. Once a freed temporary just under 32 MiB has raised its mmap threshold, later matrices and scratch come from
the heap too, and a conversion's scratch piles up there. On a two-layer gpt-oss file, one load in eight peaked
0.95 GB over another (2.7 against 1.8 GB): a freed 33 MB per expert converted. So a load checks its RSS after each
part it makes, and trims the heap when the RSS has grown past what it keeps by more than a slack.

A running CPU engine does the opposite: `keep_freed_heap` once it is built. A step's temporaries come and go, and
glibc maps each large one afresh and unmaps it when freed, so every page of it is a page fault and a zeroing on each
step. A 512-token prefill of the Qwen3-30B-A3B geometry (24 layers) faulted 0.3-2 GB of them a prefill, 0.4-6 s of
kernel time beside 2.7 s of work; kept in the heap, they are reused and the faults stop. The threads started after it
(the engine's step loop, its prompt workers) share one heap: with an arena of its own, the step loop grew a second
heap beside the one the load freed into, and a Qwen3-8B engine peaked 0.05-0.35 GB higher (up to 11% over the plan
`resolve` gave) at the same speed."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

SLACK = 64 << 20  # what a load may hold beyond its weights before it trims: a few of its temporaries
_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    """This process's resident set now (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except OSError:
        return 0


def release_freed_heap() -> None:
    """Hand the heap's freed chunks back to the OS (about 1 ms; a no-op where the C library is not glibc)."""
    trim = _libc_function("malloc_trim")
    if trim is not None:
        trim(0)


M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8  # mallopt's parameters (malloc.h)


def keep_freed_heap() -> None:
    """From now on what the process frees stays in its heap for its next allocations: no large block gets its own
    mapping (M_MMAP_MAX 0), and the heap's free top is not handed back below 2 GiB (M_TRIM_THRESHOLD, an int); and
    the threads started from now on share the heap (one_arena). The RSS stays at the steps' peak, which the memory
    plan counts anyway. A no-op where the C library is not glibc."""
    mallopt = _libc_function("mallopt")
    if mallopt is not None:
        mallopt(M_MMAP_MAX, 0)
        mallopt(M_TRIM_THRESHOLD, 2**31 - 1)
    one_arena()


def one_arena() -> None:
    """A thread started from now on allocates in the heaps there are (M_ARENA_MAX 1), not in a new one of its own.
    Set as a load begins too: glibc fixes its arena limit once more than 8 arenas exist, and a thread keeps the
    arena it has. A no-op where the C library is not glibc."""
    mallopt = _libc_function("mallopt")
    if mallopt is not None:
        mallopt(M_ARENA_MAX, 1)


@functools.cache
def _libc_function(name: str):
    """glibc's function `name`, or None. Found once: find_library runs `ldconfig -p` (1.6 ms), and a load trims
    hundreds of times (a warm 8B load spent 0.6 s finding it)."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):  # not glibc: nothing to tune this way
        return None


class HeapBound:
    """Holds a load's RSS to what it keeps: `check(kept)`, with `kept` the bytes it has added since it began, trims
    the heap when the RSS has grown past them by more than SLACK."""

    def __init__(self) -> None:
        self.start = rss_bytes()
        one_arena()  # before the engine's threads start, and before glibc fixes its arena limit

    def check(self, kept: int) -> None:
        if rss_bytes() > self.start + kept + SLACK:
            release_freed_heap()
