"""Slow weight conversions (an AWQ / GPTQ checkpoint's Q4_1 blocks; a GGUF's repacks) saved once under
INFERPLUG_HOME/conversions and mapped the next time instead of converted, as llama.cpp maps a GGUF.

    cached_weights(key_parts, build) -> build()'s {name: tensor or layer}, from the entry of key_parts when there is a
                                        sound one, else built, saved and mapped (the built copy is freed)
    cached_text(key_parts, suffix, build)
                                     -> the path of a file holding build()'s text (a GGUF's tokenizer as tokenizers'
                                        JSON), from the cache or written now; None when the cache is off
    file_identity(path)              -> a key part naming a source file: the sha256 `inferplug pull` recorded for it
                                        (while its size and mtime still match), else its path, size and mtime_ns

An entry is one file named by the sha256 of its key parts (so no key can name a path outside the directory): a
header (magic, FORMAT_VERSION, the key parts, each item's layout from quant/layer_codec.py, each tensor's dtype,
shape and offset) and the tensors' bytes, page-aligned. A hit maps the entry's tensors copy-on-write (a write into a weight
never reaches the file) in one mapping and builds each tensor over it: no copy, no read until a weight is used, and
a tensor the model drops (q/k/v once fused into one) gives its pages back (MADV_DONTNEED), which would otherwise stay
in the resident set. One mapping, because 2 MiB pages map only a 2 MiB window that lies whole in one mapping: a
mapping per tensor left each tensor's first and last window in 4 KiB pages (23% of gpt-oss-20b's weights; a decode
step 0.88-0.98x the time in one mapping). The mapping asks for 2 MiB pages, and an entry the page cache holds in
small ones is dropped from it to be read again (models/huge_pages.py: a decode step streams every weight, 0.74-0.85x
the time on them). An entry whose header does not parse or disagrees with the file's size, the key or FORMAT_VERSION is rebuilt, never trusted;
the bytes themselves are not hashed (that would read them all, the cost the mapping saves). The key parts carry the
caller's own conversion version, so changing a conversion misses its old entries, which then age out.

Bound: INFERPLUG_CONVERSION_CACHE_GIB (default 16: a 7B AWQ model converts to ~5.4 GB, so two or three models).
After a write the least recently used entries (by mtime, which a hit touches) are deleted until the rest fit. An
entry larger than the default bound is kept alone (the others go; under the default the most recently used weights
entry is never evicted, so the model's tokenizer file, written first on its next load, cannot push it out), so a
model of more than 16 GiB (Qwen3-30B-A3B's 18.6 GB) maps on its later loads instead of converting on each (124 s at
48 layers); one larger than a bound the variable sets is not written at all. No entry is written that would leave
its disk under DISK_SLACK free: the least recently used entries are deleted first when that makes room (a stale model
gives way to the one loading now), and nothing is when it would not. 0 turns the cache off.
Symlinks: entries are opened with O_NOFOLLOW and the directory is checked with lstat. A symlink where an entry
belongs is never read (the rebuilt entry replaces the link), and a symlinked cache directory is not used.
Writes go to a temp file in the directory, then os.replace: no reader ever sees half an entry.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import math
import mmap
import os
import re
import shutil
import stat
import struct
import tempfile
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from inferplug import sources
from inferplug.errors import ProfileError
from inferplug.models import huge_pages
from inferplug.models.heap import release_freed_heap

log = logging.getLogger(__name__)

MAGIC = b"IPCONV\x00\x00"
FORMAT_VERSION = 2
ALIGN = 4096  # a page: a dropped tensor gives back whole pages, none of its neighbours'
SIZE_ENV = "INFERPLUG_CONVERSION_CACHE_GIB"
DEFAULT_GIB = 16.0
DISK_SLACK = 4 << 30  # what an entry's write leaves free on its disk, at least
ENTRY_NAME = re.compile(r"^[0-9a-f]{64}(\.entry|\.[a-z]+\.json)$")  # weights, or a cached_text file
TEMP_PREFIX = ".part-"
STALE_TEMP_S = 3600  # a live write of a 7B entry takes well under a minute
DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")


def cached_weights(key_parts: Sequence[object], build: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    place = _entry_place(key_parts, ".entry")
    if place is None:
        return build()
    folder, limit, key, path = place
    found = read_entry(path, key)
    if found is not None:
        return found
    weights = build()
    try:
        if not write_entry(path, key, weights, limit):
            return weights
        evict(folder, limit, keep=path)
    except OSError as exc:  # a full disk or a read-only home: the load still succeeds, just uncached
        log.warning("conversion cache: cannot save %s (%s); the next load converts again", path, exc)
        return weights
    try:
        mapped = read_entry(path, key)
    except OSError as exc:  # mmap refused (no address space, a strict overcommit): run on the converted copy
        log.warning("conversion cache: cannot map %s (%s); this load runs on its converted copy", path, exc)
        return weights
    if mapped is None:
        return weights
    # the entry's mapping in place of the converted copy, whose pages are 4 KiB ones (a Qwen3-8B decode step on the
    # copy took 130-166 ms against 127-133 on the mapping); the copy's memory goes back to the OS, not to the heap
    del weights
    release_freed_heap()
    return mapped


def cached_text(key_parts: Sequence[object], suffix: str, build: Callable[[], str]) -> Path | None:
    """A file holding build()'s text, named by the key parts' hash and `suffix` (".tokenizer.json"): the entry
    when there is one (a hit is a use: its mtime is touched), else written now. The caller reads it, and deletes it
    if it does not parse (a later load then writes it again). None when the cache is off or the write failed."""
    place = _entry_place(key_parts, suffix)
    if place is None:
        return None
    folder, limit, _, path = place
    try:
        if stat.S_ISREG(os.lstat(path).st_mode):  # lstat: a symlink where the entry belongs is replaced, not read
            os.utime(path)
            return path
    except FileNotFoundError:
        pass
    data = build().encode()
    try:
        write_atomically(path, lambda f: f.write(data))
    except OSError as exc:  # a full disk or a read-only home: the caller goes on without the file
        log.warning("conversion cache: cannot save %s (%s)", path, exc)
        return None
    evict(folder, limit, keep=path)
    return path


def _entry_place(key_parts: Sequence[object], suffix: str) -> tuple[Path, int, list[str], Path] | None:
    """The cache folder, its bound, the key as strings and the path of its entry (the key's hash and `suffix`), or
    None when the cache is off."""
    limit = limit_bytes()
    folder = cache_dir() if limit else None
    if folder is None:
        return None
    key = [str(part) for part in key_parts]
    return folder, limit, key, folder / (hashlib.sha256(json.dumps(key).encode()).hexdigest() + suffix)


def write_atomically(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """write(f) into a temp file beside `path`, then os.replace: no reader ever sees half an entry, and a symlink
    where the entry belongs is replaced itself, never its target. The temp file goes if anything fails."""
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=TEMP_PREFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def file_identity(path: Path) -> str:
    path = Path(path)
    st = path.stat()
    record = sources.read_record(path)
    if record and record.get("sha256") and (record.get("size"), record.get("mtime_ns")) == (st.st_size, st.st_mtime_ns):
        return f"sha256:{record['sha256']}"
    return f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"


def bound_is_set() -> bool:
    """Whether SIZE_ENV sets the bound (kept strictly), rather than the default (which keeps a larger entry alone)."""
    return bool(os.environ.get(SIZE_ENV, "").strip())


def limit_bytes() -> int:
    raw = os.environ.get(SIZE_ENV, "").strip()
    try:
        gib = float(raw) if raw else DEFAULT_GIB
        if not gib >= 0 or math.isinf(gib):
            raise ValueError(raw)
    except ValueError:
        raise ProfileError(f"{SIZE_ENV}={raw!r} is not a size in GiB; set it to a number such as 16, or 0 to turn "
                           "the conversion cache off") from None
    return int(gib * (1 << 30))


def cache_dir() -> Path | None:
    """INFERPLUG_HOME/conversions, made if missing; None (with a warning) where it is not a real directory."""
    folder = sources.home() / "conversions"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        st = os.lstat(folder)
    except OSError as exc:
        log.warning("conversion cache off: cannot make %s (%s)", folder, exc)
        return None
    if not stat.S_ISDIR(st.st_mode):  # lstat: a symlink is not a directory here
        log.warning("conversion cache off: %s is a symlink or not a directory; make it a plain directory", folder)
        return None
    return folder


def read_entry(path: Path, key: list[str]) -> dict[str, Any] | None:
    """The entry's weights over a private mapping of it, or None when there is no sound entry (then it is rebuilt)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:  # ELOOP: a symlink stands where the entry belongs
        log.warning("conversion cache: not reading %s (%s); converting again", path, exc)
        return None
    try:
        size = os.fstat(fd).st_size
        if not stat.S_ISREG(os.fstat(fd).st_mode) or size < len(MAGIC) + 8:
            raise ValueError(f"not a regular file of at least a header ({size} bytes)")
        weights = _decode(fd, key, size)
        os.utime(fd)  # the LRU order: a hit is a use
        return weights
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, struct.error, RuntimeError) as exc:
        log.warning("conversion cache: %s is damaged or stale (%s); converting again", path, exc)
        return None
    finally:
        os.close(fd)


def _decode(fd: int, key: list[str], size: int) -> dict[str, Any]:
    import torch

    from inferplug.quant.layer_codec import rebuild

    start = len(MAGIC) + 8
    head = os.pread(fd, start, 0)
    if head[: len(MAGIC)] != MAGIC:
        raise ValueError("not a conversion cache entry (bad magic)")
    (length,) = struct.unpack_from("<Q", head, len(MAGIC))
    if length > size - start:
        raise ValueError(f"header length {length} past the file's end")
    header = json.loads(os.pread(fd, length, start))
    if header.get("format") != FORMAT_VERSION or header.get("key") != key:
        raise ValueError(f"written by format {header.get('format')} for another key")
    data = _aligned(start + length)
    if data + header["data_bytes"] != size:
        raise ValueError(f"{size} bytes where the header promises {data + header['data_bytes']}")
    layout = []
    for t in header["tensors"]:
        dtype, shape, offset = t["dtype"], [int(n) for n in t["shape"]], int(t["offset"])
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}")
        nbytes = math.prod(shape) * getattr(torch, dtype).itemsize
        if offset % ALIGN or offset < 0 or offset + nbytes > header["data_bytes"]:
            raise ValueError(f"a tensor at {offset} (+{nbytes} bytes) outside the data")
        layout.append((getattr(torch, dtype), shape, data + offset, nbytes))
    if huge_pages.prefer_huge_folios(fd, data, header["data_bytes"]):
        log.info("conversion cache: the page cache held this entry in 4 KiB pages; dropped, to be read again in 2 MiB ones")
    mapped = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)  # from offset 0: any page size maps it
    huge_pages.advise(mapped)
    # a shared lock for the mapping's life: an entry in use (here or in another process) is not deleted to make room
    # on the disk, where deleting it would free nothing (_room_on_disk)
    held = os.dup(fd)
    try:
        fcntl.flock(held, fcntl.LOCK_SH)
    except OSError:  # a filesystem without locks: the entry runs unguarded
        pass
    weakref.finalize(mapped, os.close, held).atexit = False

    def tensor(index: int) -> torch.Tensor:
        dtype, shape, offset, nbytes = layout[index]
        if not nbytes:
            return torch.empty(shape, dtype=dtype)
        span = memoryview(mapped)[offset:offset + nbytes]
        # the tensor and its views hold `span`; when the last goes, its pages leave the resident set
        weakref.finalize(span, _give_back, mapped, offset, offset + nbytes).atexit = False
        return torch.frombuffer(span, dtype=torch.uint8).view(dtype).view(shape)

    return {name: rebuild(item, tensor) for name, item in header["items"].items()}


def _give_back(mapped: mmap.mmap, start: int, end: int) -> None:
    """Drops the pages inside a dead tensor's bytes [start, end) from this process (the page cache keeps them), none
    a neighbour shares (tensors are ALIGN-aligned; a host with larger pages keeps the edge ones); the mapping goes
    with the last tensor."""
    first, last = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE, _aligned(end) // mmap.PAGESIZE * mmap.PAGESIZE
    if last > first and hasattr(mmap, "MADV_DONTNEED"):
        mapped.madvise(mmap.MADV_DONTNEED, first, last - first)


def write_entry(path: Path, key: list[str], weights: dict[str, Any], limit: int) -> bool:
    """Writes the entry atomically; False (nothing written) when it alone would exceed a bound the variable sets, or
    leave its disk under DISK_SLACK free with every other entry deleted."""
    import torch

    from inferplug.quant.layer_codec import flatten

    tensors: list[torch.Tensor] = []
    items = {name: flatten(obj, tensors) for name, obj in weights.items()}
    layout, offset = [], 0
    for t in tensors:
        layout.append({"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "offset": offset})
        offset = _aligned(offset + t.nbytes)
    header = json.dumps({"format": FORMAT_VERSION, "key": key, "items": items, "tensors": layout,
                         "data_bytes": offset}).encode()
    data = _aligned(len(MAGIC) + 8 + len(header))
    gib = (data + offset) / 2**30
    if data + offset > limit and bound_is_set():
        log.warning("conversion cache: this model's %.1f GiB of converted weights exceed %s=%s, so it is not saved and "
                    "every load converts again; raise %s to keep it", gib, SIZE_ENV, os.environ[SIZE_ENV], SIZE_ENV)
        return False
    if not _room_on_disk(path, data + offset + DISK_SLACK):
        log.warning("conversion cache: saving this model's %.1f GiB of converted weights would leave %s under %d GiB "
                    "free, even with the cache's unused entries deleted; not saved, so every load converts again", gib,
                    path.parent, DISK_SLACK >> 30)
        return False
    if data + offset > limit:
        log.info("conversion cache: this model's %.1f GiB exceed the default bound of %.0f GiB; it is kept alone",
                 gib, DEFAULT_GIB)

    def write(f: BinaryIO) -> None:
        f.write(MAGIC + struct.pack("<Q", len(header)) + header)
        for t, entry in zip(tensors, layout):
            f.seek(data + entry["offset"])
            if t.nbytes:
                f.write(memoryview(t.view(-1).view(torch.uint8).numpy()))
        f.truncate(data + offset)

    write_atomically(path, write)
    return True


def _room_on_disk(path: Path, need: int) -> bool:
    """Whether `need` bytes are free on path's disk, after deleting the cache's least recently used entries if that
    makes them so (an old model's entry gives way to the one loading now, as the bound's eviction would). Entries a
    process maps are kept: deleting one would free nothing until that process ends. Nothing is deleted when even all
    the others would not make room."""
    free = shutil.disk_usage(path.parent).free
    if need <= free:
        return True
    others = [(size, entry) for _, size, entry in sorted(scan_entries(path.parent, ENTRY_NAME))
              if entry.suffix == ".entry" and entry != path and not _in_use(entry)]  # the text files are small
    if free + sum(size for size, _ in others) < need:
        return False
    for size, entry in others:
        entry.unlink(missing_ok=True)
        log.info("conversion cache: deleted %s (%.1f GiB, least recently used) to make room on its disk", entry.name,
                 size / 2**30)
        if need <= shutil.disk_usage(path.parent).free:
            return True
    return False


def _in_use(entry: Path) -> bool:
    """Whether a process (this one too) maps the entry: read_entry holds a shared lock on it while it does."""
    try:
        fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False  # gone, or a symlink (scan_entries deletes those)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    except OSError:  # a filesystem without locks cannot tell
        return False
    finally:
        os.close(fd)


def evict(folder: Path, limit: int, keep: Path) -> None:
    """Deletes the least recently used entries until the rest fit in `limit` (`keep`, the newest, stays). Under the
    default bound the most recently used weights entry stays too: one larger than the bound is kept alone, and a
    model's tokenizer file written on its next load (before its weights are read) must not push it out."""
    entries = sorted(scan_entries(folder, ENTRY_NAME))
    total = sum(size for _, size, _ in entries)
    kept = {keep}
    weights = [path for _, _, path in entries if path.suffix == ".entry"]
    if weights and not bound_is_set():
        kept.add(weights[-1])
    for _, size, path in entries:
        if total <= limit:
            break
        if path not in kept:
            path.unlink(missing_ok=True)
            total -= size


def scan_entries(folder: Path, entry_name: re.Pattern[str]) -> list[tuple[int, int, Path]]:
    """(mtime_ns, size, path) of the entries in `folder` (the LRU order); deletes symlinks where entries belong
    (never followed) and the temp files of writes that died more than STALE_TEMP_S ago. Shared by the document KV
    disk tier (engine/doc_disk.py)."""
    entries = []
    for path in folder.iterdir():
        try:
            st = os.lstat(path)
        except FileNotFoundError:  # another process's eviction got there first
            continue
        if path.name.startswith(TEMP_PREFIX) and time.time() - st.st_mtime > STALE_TEMP_S:
            path.unlink(missing_ok=True)
        if not entry_name.match(path.name):
            continue
        if stat.S_ISLNK(st.st_mode):
            path.unlink(missing_ok=True)
        elif stat.S_ISREG(st.st_mode):
            entries.append((st.st_mtime_ns, st.st_size, path))
    return entries


def _aligned(offset: int) -> int:
    return -(-offset // ALIGN) * ALIGN
