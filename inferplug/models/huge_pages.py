"""Weights and KV pools on 2 MiB pages.

A decode step streams every weight from DRAM once. On 4 KiB pages each 4 KiB takes a TLB entry of its own and the
hardware prefetcher stops at its end; a 2 MiB page holds 512 of them behind one entry. Measured on a 2-core Zen 4
(Qwen3-8B Q4_K_M, the same mapped weights switched between the two in one process): a one-stream decode step
0.74-0.84x the time, an 8-stream step 0.85x (docs/benchmarks.md, "Weights and KV pools on 2 MiB pages").

A file mapping gets them from the page cache: advised MADV_HUGEPAGE, it reads ahead in 2 MiB folios (Linux 5.18+,
on a filesystem with large folios: ext4 on 6.x, xfs) and maps each with one page-table entry. Bytes the page cache
already holds in small folios (an entry this process or a `cp` just wrote) stay in them, so `prefer_huge_folios`
probes windows of the file first and drops its cached pages when a re-read would bring them back in 2 MiB folios.

    advise(mapped)                           -> MADV_HUGEPAGE on a mapping of at least 2 MiB
    zeros(shape, dtype)                      -> torch.zeros on a mapping advised so before its first touch (KV pools)
    prefer_huge_folios(fd, offset, length)   -> True when it dropped the range's small folios for a re-read
    status(sysfs)                            -> `inferplug doctor`'s line: whether this host gives them, or the fix
"""

from __future__ import annotations

import ctypes
import math
import mmap
import os
import re
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

HUGE = 2 << 20
PROBES = 4
THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"
_RANGE = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) ")


def advise(mapped: mmap.mmap) -> None:
    """Ask for 2 MiB folios and page-table entries on `mapped` (the kernel may decline: nothing changes then)."""
    if len(mapped) >= HUGE and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            mapped.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # THP compiled out
            pass


def zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """torch.zeros on 2 MiB pages where the kernel gives them: a mapping of its own (malloc may hand back heap
    pages already touched in 4 KiB ones), advised before the zeroing touches it. The KV pools: a long-context decode
    step reads a sequence's blocks all over them (paged attention at 4-8k tokens of context 0.92-0.94x the time)."""
    import torch

    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < HUGE or sys.platform != "linux":
        return torch.zeros(shape, dtype=dtype)
    mapped = mmap.mmap(-1, nbytes + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advise(mapped)
    skip = -_address(mapped) % HUGE  # the tensor starts on a 2 MiB page
    # the tensor holds the mapping: it is unmapped when the tensor goes
    tensor = torch.frombuffer(mapped, dtype=torch.uint8, count=nbytes, offset=skip).view(dtype).view(shape)
    return tensor.zero_()  # resident now, as torch.zeros would be


def status(sysfs: str = THP_SETTING) -> str | None:
    """Whether the weights and KV pools get 2 MiB pages here, by the kernel's THP setting ("always [madvise]
    never": the bracketed one holds), or how to turn them on; None where there is no such setting (not Linux)."""
    try:
        with open(sysfs) as setting:
            mode = re.search(r"\[(\w+)\]", setting.read())
    except OSError:
        return None
    if mode is None:
        return None
    if mode[1] == "never":
        return ("off (transparent_hugepage: never): decode steps take 1.2-1.35x the time on 4 KiB pages; "
                f"`echo madvise > {sysfs}` as root turns them on")
    return f"on for mapped weights and KV pools (transparent_hugepage: {mode[1]})"


def prefer_huge_folios(fd: int, offset: int, length: int) -> bool:
    """Whether the page cache held [offset, offset + length) of the file in small folios that a re-read would
    replace with 2 MiB ones, and dropped them (the next reads come from disk, once). It probes PROBES 2 MiB windows
    spread over the range (a load before this version read an MoE's experts in small folios and its head in huge
    ones); at the first small one it drops that window alone and probes it again, and drops the rest only when it
    came back huge: a filesystem or kernel without large folios keeps its cache."""
    for k in range(PROBES):
        window = -(-(offset + length * (2 * k + 1) // (2 * PROBES)) // HUGE) * HUGE
        if window + HUGE > offset + length:
            continue
        huge = _maps_huge(fd, window)
        if huge is None:
            return False  # no /proc to ask
        if not huge:
            break
    else:
        return False  # huge already, or too small to tell
    try:
        os.fdatasync(fd)  # pages a write left dirty are not dropped
        os.posix_fadvise(fd, window, HUGE, os.POSIX_FADV_DONTNEED)
        if not _maps_huge(fd, window):
            return False
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
    except OSError:  # a filesystem that refuses either: the pages stay as they are
        return False
    return True


def _maps_huge(fd: int, window: int) -> bool | None:
    """Whether a fresh mapping of the 2 MiB at `window` (2 MiB-aligned) maps them with one page-table entry once
    touched; None where /proc/self/smaps cannot say."""
    mapped = mmap.mmap(fd, HUGE, access=mmap.ACCESS_COPY, offset=window)  # the kernel aligns it to 2 MiB
    try:
        advise(mapped)
        mapped[0]  # the fault that reads the window in
        return _pmd_mapped_kib(_address(mapped)) > 0 if os.path.exists("/proc/self/smaps") else None
    except OSError:
        return None
    finally:
        mapped.close()


def _address(mapped: mmap.mmap) -> int:
    """Where a writable mapping starts, holding no exported pointer after (a mapping with one cannot close)."""
    view = ctypes.c_char.from_buffer(mapped)
    try:
        return ctypes.addressof(view)
    finally:
        del view


def _pmd_mapped_kib(address: int) -> int:
    """FilePmdMapped of the mapping that holds `address`, from /proc/self/smaps."""
    with open("/proc/self/smaps") as smaps:
        inside = False
        for line in smaps:
            bounds = _RANGE.match(line)
            if bounds:
                inside = int(bounds[1], 16) <= address < int(bounds[2], 16)
            elif inside and line.startswith("FilePmdMapped:"):
                return int(line.split()[1])
    return 0
