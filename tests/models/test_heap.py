"""glibc's heap as a running CPU engine keeps it (models/heap.py): a step's large temporaries reused, not mapped afresh."""

from __future__ import annotations

import resource

import pytest
import torch

from inferplug.models.heap import _libc_function, keep_freed_heap

BLOCK = 64 << 20  # past glibc's largest mmap threshold (32 MiB): by default mapped on malloc, unmapped on free


@pytest.mark.skipif(_libc_function("mallopt") is None, reason="the C library is not glibc")
def test_a_freed_large_block_is_reused_without_page_faults():
    keep_freed_heap()  # what ModelRunner does on a CPU
    for _ in range(2):  # as a step's first two steps: pages faulted in, then freed into the heap
        torch.empty(BLOCK, dtype=torch.uint8).fill_(1)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    # a little smaller: torch's 64-byte aligned allocation asks glibc for more than the block it got (the alignment's
    # slack), so a same-size one fits the freed block only where its neighbour is free too
    torch.empty(BLOCK - (1 << 20), dtype=torch.uint8).fill_(1)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert faults < BLOCK // 4096 // 16, f"{faults} page faults: the block was mapped afresh"



THREAD_USES_THE_HEAP = """
import threading, torch
from inferplug.models.heap import keep_freed_heap
keep_freed_heap()
block = []
def step():  # as the engine's step loop, started once the runner is built
    block.append(torch.empty(16 << 20, dtype=torch.uint8).fill_(1).data_ptr())
thread = threading.Thread(target=step)
thread.start()
thread.join()
start, end = next((int(a, 16), int(b, 16)) for a, b, *rest in
                  (line.split()[0].split("-") + line.split()[-1:] for line in open("/proc/self/maps")) if rest == ["[heap]"])
print(start <= block[0] < end)
"""


@pytest.mark.skipif(_libc_function("mallopt") is None, reason="the C library is not glibc")
def test_a_thread_started_later_allocates_in_the_heap_the_load_freed_into():
    """A thread started after keep_freed_heap allocates in the process's heap (the brk heap a load frees into), not
    in an arena of its own, which a Qwen3-8B engine's step loop grew beside it: 0.05-0.35 GB over resolve's plan. In a
    fresh interpreter: a thread of this test process may hold an arena already."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", THREAD_USES_THE_HEAP], capture_output=True, text=True, check=True)
    assert out.stdout.split()[-1] == "True", "the thread allocated in an arena of its own"
