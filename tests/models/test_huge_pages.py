"""Weights and KV pools on 2 MiB pages (models/huge_pages.py): a conversion-cache hit maps its tensors with one
page-table entry per 2 MiB, across their edges, whatever folios the page cache held, drops the cache only once, and
gives a dropped tensor's pages back; a KV pool is zeroed into 2 MiB pages."""

from __future__ import annotations

import gc
import mmap
import os
import re
from pathlib import Path

import pytest
import torch

from inferplug.models import conversion_cache, huge_pages
from inferplug.models.conversion_cache import cached_weights

MIB = 1 << 20


def rollup_kib(field: str) -> int:
    """A field of the whole process's smaps_rollup: a reading of its own beside the module's per-mapping one."""
    return int(re.search(rf"{field}:\s+(\d+)", Path("/proc/self/smaps_rollup").read_text())[1])


def pmd_mapped_kib() -> int:
    return rollup_kib("FilePmdMapped")


def host_maps_file_pages_huge(folder: Path) -> bool:
    """Whether this kernel and filesystem read an advised file mapping into 2 MiB folios and map them so."""
    path = folder / "probe"
    path.write_bytes(os.urandom(4 * MIB))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        mapped = mmap.mmap(fd, 4 * MIB, access=mmap.ACCESS_READ)
        mapped.madvise(mmap.MADV_HUGEPAGE)
        before = pmd_mapped_kib()
        sum(mapped[at] for at in range(0, 4 * MIB, 4096))
        grew = pmd_mapped_kib() - before
        mapped.close()
        return grew >= 2048
    finally:
        os.close(fd)
        path.unlink()


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    if not Path("/proc/self/smaps_rollup").exists():
        pytest.skip("no /proc/self/smaps_rollup to read the page-table entries from")
    if not host_maps_file_pages_huge(tmp_path):
        pytest.skip("this kernel or filesystem maps no file pages in 2 MiB folios (THP off, or no large folios)")
    monkeypatch.setenv("INFERPLUG_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(conversion_cache.SIZE_ENV, raising=False)
    return tmp_path / "home"


def weights() -> dict[str, torch.Tensor]:
    return {"large": torch.randint(0, 256, (8 * MIB,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)),
            "small": torch.arange(10)}


def rewrite_in_small_pieces(path: Path) -> None:
    """The same bytes written back 4 KiB at a time into an emptied page cache, as a copy tool may leave a file: in
    4 KiB folios."""
    data = path.read_bytes()
    fd = os.open(path, os.O_RDWR)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        for at in range(0, len(data), 4096):
            os.pwrite(fd, data[at:at + 4096], at)
    finally:
        os.close(fd)


def test_a_hit_maps_its_tensors_on_2_mib_pages_across_their_edges_whatever_the_write_left(home):
    gen = torch.Generator().manual_seed(1)
    built = {**weights(), **{f"part{i}": torch.randint(0, 256, (4 * MIB,), dtype=torch.uint8, generator=gen)
                             for i in range(4)}}
    cached_weights(["huge"], lambda: built)
    [entry] = (home / "conversions").glob("*.entry")
    rewrite_in_small_pieces(entry)
    hit = cached_weights(["huge"], lambda: pytest.fail("converted again"))
    before = pmd_mapped_kib()
    assert all(torch.equal(hit[name], tensor) for name, tensor in built.items())
    # 24 MiB of tensors, 4 KiB-aligned in the file: in one mapping, every 2 MiB window but the data's first and last
    # maps whole, those across two tensors' edge too (a mapping per tensor: at most 1 of each 4 MiB part's 2)
    assert pmd_mapped_kib() - before >= 20 * 1024


def entry_rss_kib(entry: Path) -> int:
    """The resident KiB of this process's mappings of `entry`."""
    total, ours = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            ours = line.endswith(str(entry))
        elif ours and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


def test_a_tensor_the_model_drops_leaves_the_resident_set(home):
    built = weights()
    cached_weights(["huge"], lambda: built)
    [entry] = (home / "conversions").glob("*.entry")
    hit = cached_weights(["huge"], lambda: pytest.fail("converted again"))
    kept = hit["large"][: 2 * MIB]  # a view holds its tensor's pages
    assert int(hit["large"].sum()) == int(built["large"].sum())
    resident = entry_rss_kib(entry)
    assert resident >= 8 * 1024
    del hit["large"]
    gc.collect()
    assert entry_rss_kib(entry) >= 8 * 1024 and torch.equal(kept, built["large"][: 2 * MIB])
    del kept
    gc.collect()
    assert entry_rss_kib(entry) <= resident - 7 * 1024  # its pages given back (the small tensor's window may stay)
    assert torch.equal(hit["small"], built["small"])


def test_a_hit_on_huge_folios_keeps_the_page_cache(home, monkeypatch):
    cached_weights(["huge"], weights)
    first = cached_weights(["huge"], weights)
    assert int(first["large"].sum()) > 0  # read in, in 2 MiB folios
    dropped = []
    monkeypatch.setattr(os, "posix_fadvise", lambda *args: dropped.append(args))
    second = cached_weights(["huge"], lambda: pytest.fail("converted again"))
    assert torch.equal(second["large"], first["large"])
    assert dropped == []  # no second read from disk


def test_a_kv_pool_is_zeroed_into_2_mib_pages():
    setting = Path(huge_pages.THP_SETTING)
    if not Path("/proc/self/smaps_rollup").exists() or not setting.exists() or "[never]" in setting.read_text():
        pytest.skip("no transparent huge pages here (not Linux, or THP set to never)")
    before = rollup_kib("AnonHugePages")
    pool = huge_pages.zeros((8, 512, 16, 128), torch.float16)  # 16 MiB, as decoder.allocate_kv_cache asks
    assert pool.shape == (8, 512, 16, 128) and pool.dtype == torch.float16 and not pool.any()
    assert rollup_kib("AnonHugePages") - before >= 2048  # some 2 MiB page (all of them where memory is not fragmented)
