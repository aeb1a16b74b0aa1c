"""Keeping a load's freed scratch out of its RSS.

glibc keeps what a process frees inside its heap instead of handing it back. Once a freed temporary just under
32 MiB has raised its mmap threshold, later matrices and scratch come from the heap too, and a conversion's
scratch piles up there. On a two-layer gpt-oss file, one load in eight peaked 0.95 GB over another (2.7 against
1.8 GB): a freed 33 MB per expert converted. So a load checks its RSS after each part it makes, and trims the heap
when the RSS has grown past what it keeps by more than a slack."""

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
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None. Found once: find_library runs `ldconfig -p` (1.6 ms), and a load trims
    hundreds of times (a warm 8B load spent 0.6 s finding it)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to trim this way
        return None


class HeapBound:
    """Holds a load's RSS to what it keeps: `check(kept)`, with `kept` the bytes it has added since it began, trims
    the heap when the RSS has grown past them by more than SLACK."""

    def __init__(self) -> None:
        self.start = rss_bytes()

    def check(self, kept: int) -> None:
        if rss_bytes() > self.start + kept + SLACK:
            release_freed_heap()
