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
    torch.empty(BLOCK, dtype=torch.uint8).fill_(1)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert faults < BLOCK // 4096 // 16, f"{faults} page faults: the block was mapped afresh"
