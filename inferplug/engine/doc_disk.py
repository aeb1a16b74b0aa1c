"""The RAG document cache's disk tier: a document's KV outlives the process (TurboRAG's chunk KV, computed once).

    DocumentKVDisk(folder, limit_bytes, namespace)
      save(key, salt, doc_key, k, v, position)  -> written (False: alone it would exceed the bound)
      load(key, salt, doc_key)                  -> (k, v, position), or None: absent, damaged or stale
      touch(key, salt, doc_key)                 -> a use, for the LRU order
      evict_document(doc_key, salt) / evict_salt(salt) -> the entries deleted

Layout: <folder>/<salt dir>/<document key>-<entry hash>.kv
- salt dir: "unsalted", or "s-" + a hash of the salt (the salt itself is never written): one tenant's entries in one
  directory, made 0700, its files 0600.
- document key: the front end's content hash of the document's text (rag.document_key), so a document's entries are
  found from its text alone, whatever model, layout or tokenization made them (evict_document).
- entry hash: of the namespace and the segment key (token ids and salt). The namespace (doc_disk_key.py) names all
  else the KV depends on (model files, weight format, dtypes, block size, RoPE, engine version): another model or an
  upgrade never reads an entry, and its old entries age out.

A file is MAGIC, the header's length, a JSON header (format, namespace, key, dtype, shape, position), K's bytes, V's
bytes, then a blake2b digest of all before it. A file whose digest, size or header disagree is deleted and missed:
the segment is computed again and written afresh, never used. Writes go to a temp file in the salt dir, then
os.replace, so no reader sees half an entry. Entries are opened with O_NOFOLLOW and directories checked with lstat:
a symlink is never followed. Bound: after a write, the least recently used entries (by mtime; a use touches it) go
until the rest fit; the total is counted once at start and kept by this process's writes and deletions.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import stat
import struct
from pathlib import Path

import torch

from inferplug.errors import ProfileError
from inferplug.models.conversion_cache import scan_entries, write_atomically

log = logging.getLogger(__name__)

MAGIC = b"IPDOCKV\x00"
FORMAT_VERSION = 1
DIGEST = 16
ENTRY_NAME = re.compile(r"^[0-9a-f]{16}-[0-9a-f]{32}\.kv$")
DOC_KEY = re.compile(r"^[0-9a-f]{16}$")
DTYPES = {str(t).removeprefix("torch."): t for t in (torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn)}


class DocumentKVDisk:
    def __init__(self, folder: Path, limit_bytes: int, namespace: str):
        self.folder, self.limit, self.namespace = Path(folder), limit_bytes, namespace
        _real_dir(self.folder)
        self.nbytes = sum(size for _, size, _ in self._entries())
        self.loads = self.writes = self.rejected = 0

    # --- entries ---------------------------------------------------------------------------
    def save(self, key: bytes, salt: str | None, doc_key: str, k: torch.Tensor, v: torch.Tensor,
             position: int) -> bool:
        header = json.dumps({"format": FORMAT_VERSION, "namespace": self.namespace, "key": key.hex(),
                             "dtype": str(k.dtype).removeprefix("torch."), "shape": list(k.shape),
                             "position": position}).encode()
        head = MAGIC + struct.pack("<Q", len(header)) + header
        payload = [head, _bytes_of(k), _bytes_of(v)]
        size = sum(map(len, payload)) + DIGEST
        if size > self.limit:
            return False
        digest = hashlib.blake2b(digest_size=DIGEST)
        for part in payload:
            digest.update(part)
        folder = self._salt_folder(salt, make=True)
        if folder is None:
            return False
        path = folder / self._name(key, doc_key)
        old = _size_of(path)
        try:
            write_atomically(path, lambda f: f.writelines((*payload, digest.digest())))
        except OSError as exc:
            log.warning("document KV cache: cannot write %s (%s); the segment stays in memory only", path, exc)
            return False
        self.nbytes += size - old
        self.writes += 1
        if self.nbytes > self.limit:
            self._evict_lru(keep=path)
        return True

    def load(self, key: bytes, salt: str | None, doc_key: str) -> tuple[torch.Tensor, torch.Tensor, int] | None:
        folder = self._salt_folder(salt)
        if folder is None:
            return None
        path = folder / self._name(key, doc_key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:  # ELOOP: a symlink stands where the entry belongs
            return self._reject(path, f"not opened ({exc})")
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > self.limit:
                return self._reject(path, "not a regular file within the bound")
            with os.fdopen(os.dup(fd), "rb") as f:
                data = f.read()
        except OSError as exc:  # an I/O error: computed instead
            return self._reject(path, str(exc))
        finally:
            os.close(fd)
        try:
            found = self._decode(data, key)
        except (ValueError, KeyError, TypeError, struct.error, RuntimeError) as exc:
            return self._reject(path, str(exc))
        self.touch(key, salt, doc_key)  # the LRU order: a load is a use
        self.loads += 1
        return found

    def touch(self, key: bytes, salt: str | None, doc_key: str) -> None:
        folder = self._salt_folder(salt)
        try:
            if folder is not None:
                os.utime(folder / self._name(key, doc_key), follow_symlinks=False)
        except OSError:  # gone (evicted by another process): it is written again when next computed
            pass

    def evict_document(self, doc_key: str, salt: str | None) -> int:
        folder = self._salt_folder(salt)
        prefix = _doc_name(doc_key) + "-"
        return self._delete([p for p in _listing(folder) if p.name.startswith(prefix)]) if folder else 0

    def evict_salt(self, salt: str | None) -> int:
        folder = self._salt_folder(salt)
        if folder is None:
            return 0
        deleted = self._delete([p for p in _listing(folder) if ENTRY_NAME.match(p.name)])
        try:
            folder.rmdir()  # empty unless a write is under way (its temp file)
        except OSError:
            pass
        return deleted

    # --- internals ----------------------------------------------------------------------------
    def _name(self, key: bytes, doc_key: str) -> str:
        entry = hashlib.blake2b(self.namespace.encode() + b"\x00" + key, digest_size=16).hexdigest()
        return f"{_doc_name(doc_key)}-{entry}.kv"

    def _salt_folder(self, salt: str | None, make: bool = False) -> Path | None:
        """The salt's directory, made (0700) if `make`; None where it is missing, or a symlink (never followed)."""
        folder = self.folder / _salt_dir(salt)
        try:
            if make:
                folder.mkdir(mode=0o700, exist_ok=True)
            if stat.S_ISDIR(os.lstat(folder).st_mode):
                return folder
            why = "it is a symlink or not a directory"
        except FileNotFoundError:
            return None
        except OSError as exc:  # a file where the directory belongs, a read-only home
            why = str(exc)
        log.warning("document KV cache: not using %s (%s)", folder, why)
        return None

    def _decode(self, data: bytes, key: bytes) -> tuple[torch.Tensor, torch.Tensor, int]:
        if len(data) < len(MAGIC) + 8 + DIGEST or data[: len(MAGIC)] != MAGIC:
            raise ValueError("not a document KV entry (bad magic or too short)")
        if hashlib.blake2b(data[:-DIGEST], digest_size=DIGEST).digest() != data[-DIGEST:]:
            raise ValueError("its digest does not match (truncated or corrupt)")
        (length,) = struct.unpack_from("<Q", data, len(MAGIC))
        start = len(MAGIC) + 8 + length
        header = json.loads(data[len(MAGIC) + 8: start])
        if (header["format"], header["namespace"], header["key"]) != (FORMAT_VERSION, self.namespace, key.hex()):
            raise ValueError("written for another format, model or key")
        dtype, shape = DTYPES[header["dtype"]], [int(n) for n in header["shape"]]
        nbytes = torch.Size(shape).numel() * dtype.itemsize
        if len(shape) != 4 or start + 2 * nbytes + DIGEST != len(data):
            raise ValueError(f"{len(data)} bytes where the header promises {start + 2 * nbytes + DIGEST}")
        k = torch.frombuffer(bytearray(data[start: start + nbytes]), dtype=torch.uint8).view(dtype).view(shape)
        v = torch.frombuffer(bytearray(data[start + nbytes: start + 2 * nbytes]), dtype=torch.uint8)
        return k, v.view(dtype).view(shape), int(header["position"])

    def _reject(self, path: Path, why: str) -> None:  # the load's result: a miss
        log.warning("document KV cache: %s is damaged or stale (%s); computing it again", path, why)
        self.rejected += 1
        self._delete([path])
        return None

    def _delete(self, paths: list[Path]) -> int:
        deleted = 0
        for path in paths:
            size = _size_of(path)
            try:
                path.unlink()  # a symlink itself, never its target
            except FileNotFoundError:
                continue
            self.nbytes, deleted = max(self.nbytes - size, 0), deleted + 1
        return deleted

    def _entries(self) -> list[tuple[int, int, Path]]:
        """(mtime_ns, size, path) of every entry; drops symlinks where entries belong and dead writes' temp files."""
        found = []
        for folder in _listing(self.folder):
            try:
                if stat.S_ISDIR(os.lstat(folder).st_mode):  # a symlinked salt dir is never entered
                    found += scan_entries(folder, ENTRY_NAME)
            except FileNotFoundError:  # another process's evict_salt got there first
                continue
        return found

    def _evict_lru(self, keep: Path) -> None:
        entries = self._entries()  # recounted: other processes share the folder
        self.nbytes = sum(size for _, size, _ in entries)
        for _, _, path in sorted(entries):
            if self.nbytes <= self.limit:
                break
            if path != keep:
                self._delete([path])


def _real_dir(folder: Path) -> None:
    """Make `folder` (0700) if missing; ProfileError where it is a symlink or not a directory."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(folder)
    except OSError as exc:
        raise ProfileError(f"the document KV disk tier cannot use {folder} ({exc}); set [cache] rag_disk_dir to a "
                           "writable directory, or rag_disk_size = \"0\" to turn the tier off") from None
    if not stat.S_ISDIR(st.st_mode):  # lstat: a symlink is not a directory here
        raise ProfileError(f"the document KV disk tier will not use {folder}: it is a symlink or not a directory; "
                           "set [cache] rag_disk_dir to a plain directory")


def _listing(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def _size_of(path: Path) -> int:
    try:
        return os.lstat(path).st_size
    except FileNotFoundError:
        return 0


def _salt_dir(salt: str | None) -> str:
    return "s-" + hashlib.blake2b(salt.encode(), digest_size=16).hexdigest() if salt else "unsalted"


def _doc_name(doc_key: str) -> str:
    """The front end's content key as a file name part: as is when it is one (16 hex digits), else hashed."""
    return doc_key if DOC_KEY.match(doc_key) else hashlib.blake2b(doc_key.encode(), digest_size=8).hexdigest()


def _bytes_of(t: torch.Tensor) -> bytes:
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
