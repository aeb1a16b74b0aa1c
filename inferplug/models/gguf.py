"""Reading GGUF files: metadata, the tensor table and memory-mapped tensor bytes.

Our own parser instead of `gguf.GGUFReader`: that one builds a numpy view per metadata array
element, which takes ~10 s on a 49k-token vocabulary; this one reads the header in well under
a second and never touches tensor data until a tensor is asked for.
Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from inferplug.errors import ModelSourceError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# Metadata value types (gguf.md "gguf_metadata_value_type"): fixed-size scalars by struct format.
_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9

# ggml tensor types we can read: name -> (type id, elements per block, bytes per block).
GGML_TYPES: dict[str, tuple[int, int, int]] = {
    "F32": (0, 1, 4),
    "F16": (1, 1, 2),
    "Q4_0": (2, 32, 18),
    "Q4_1": (3, 32, 20),
    "Q5_0": (6, 32, 22),
    "Q5_1": (7, 32, 24),
    "Q8_0": (8, 32, 34),
    "Q2_K": (10, 256, 84),
    "Q3_K": (11, 256, 110),
    "Q4_K": (12, 256, 144),
    "Q5_K": (13, 256, 176),
    "Q6_K": (14, 256, 210),
    "BF16": (30, 1, 2),
    "MXFP4": (39, 32, 17),
}
GGML_TYPE_NAMES = {type_id: name for name, (type_id, _, _) in GGML_TYPES.items()}


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    shape: tuple[int, ...]  # torch order (rows first); ggml stores the fastest dimension first
    type_name: str  # "Q4_1", "F32", ...
    offset: int  # absolute byte offset in the file
    nbytes: int


@dataclass
class GGUFFile:
    path: Path
    metadata: dict[str, Any]
    tensors: dict[str, GGUFTensorInfo]

    @property
    def architecture(self) -> str:
        return self.metadata["general.architecture"]

    def arch_key(self, key: str, default: Any = None) -> Any:
        """An architecture-scoped value, e.g. arch_key("block_count") reads "llama.block_count"."""
        return self.metadata.get(f"{self.architecture}.{key}", default)

    def arch_count(self, key: str, default: int | None = None) -> int:
        """An architecture size (layers, heads, widths): a positive integer, or a ModelSourceError naming the key."""
        value = self.arch_key(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ModelSourceError(f"{self.path}: {self.architecture}.{key} is {str(value)[:40]}, not a positive "
                                   "integer; the file is damaged. Re-download it.")
        return value

    def read_tensor(self, handle, info: GGUFTensorInfo):
        """The raw bytes of one tensor, read from `handle` (this file, opened "rb") into a fresh uint8 torch tensor.
        Read, not mapped: a mapping's pages would count in the process's RSS beside the converted weights."""
        import torch

        raw = torch.empty(info.nbytes, dtype=torch.uint8)
        handle.seek(info.offset)
        if handle.readinto(raw.numpy()) != info.nbytes:
            raise ModelSourceError(f"{self.path} is truncated at tensor {info.name}; re-download it.")
        return raw


# Bounds on what a header may ask for, checked before anything is allocated: a hostile file fails in
# milliseconds with a ModelSourceError, never a hang, a huge list or a RecursionError.
MAX_DIMS = 4  # GGML_MAX_DIMS: ggml tensors have at most four dimensions
MAX_ARRAY_DEPTH = 2  # an array of arrays at most (llama.cpp's reader takes none)
MAX_ARRAY_ITEMS = 1 << 24  # 16M: 60x a 256k vocabulary; as a Python list about 0.5 GB
# The fewest bytes a value of each type takes: a count times this must fit in what is left of the file.
_MIN_VALUE_BYTES = {**{t: struct.calcsize(f) for t, f in _SCALAR_FORMATS.items()}, _STRING: 8, _ARRAY: 12}
_MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, the smallest value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8  # name length, n_dims, one dim, type, offset


class _Cursor:
    """Reads header fields in order; every read is checked against the file's end first."""

    def __init__(self, buffer, path: Path):
        self.buffer, self.pos, self.path, self.size = buffer, 0, path, len(buffer)

    def corrupt(self, problem: str) -> ModelSourceError:
        return ModelSourceError(f"{self.path} is not a readable GGUF file: {problem}. It is truncated or corrupt; "
                                "re-download it.")

    def _need(self, nbytes: int, what: str) -> None:
        if nbytes > self.size - self.pos:
            raise self.corrupt(f"{what} at byte {self.pos} needs {nbytes} bytes, the file has "
                               f"{self.size - self.pos} left")

    def _take(self, fmt: str, what: str) -> tuple:
        self._need(struct.calcsize(fmt), what)
        values = struct.unpack_from(fmt, self.buffer, self.pos)
        self.pos += struct.calcsize(fmt)
        return values

    def unpack(self, fmt: str, what: str = "a header field"):
        values = self._take(fmt, what)
        return values if len(values) > 1 else values[0]

    def count(self, what: str, min_item_bytes: int, limit: int | None = None) -> int:
        """A u64 count of items that take at least `min_item_bytes` each: it must fit in the rest of the file."""
        count = self.unpack("<Q", f"the count of {what}")
        if count * min_item_bytes > self.size - self.pos or (limit is not None and count > limit):
            cap = f" (at most {limit})" if limit is not None else ""
            raise self.corrupt(f"{count} {what}{cap} cannot fit in the {self.size - self.pos} bytes left at byte "
                               f"{self.pos}")
        return count

    def unpack_many(self, code: str, count: int, what: str) -> tuple:
        """`count` values of one struct type code (e.g. "Q"): tensor dims, scalar metadata arrays."""
        return self._take(f"<{count}{code}", what)

    def string(self, what: str = "a string") -> str:
        length = self.count(f"bytes of {what}", 1)
        start, self.pos = self.pos, self.pos + length
        return bytes(self.buffer[start : self.pos]).decode("utf-8", errors="replace")

    def strings(self, count: int, key: str) -> list[str]:
        """`count` strings in a row, as `string` reads each, in one loop: a 152k-token vocabulary and its merges took
        0.45 s of a load through `string`."""
        buffer, pos, size, out = self.buffer, self.pos, self.size, []
        for _ in range(count):
            if size - pos < 8:
                self.pos = pos
                self._need(8, f"the length of a string of {key}")
            (length,) = struct.unpack_from("<Q", buffer, pos)
            pos += 8
            if length > size - pos:
                self.pos = pos - 8
                raise self.corrupt(f"a string of {key} of {length} bytes cannot fit in the {size - pos} bytes left "
                                   f"at byte {pos - 8}")
            out.append(buffer[pos:pos + length].decode("utf-8", errors="replace"))
            pos += length
        self.pos = pos
        return out

    def value(self, value_type: int, key: str, depth: int = 0) -> Any:
        if value_type in _SCALAR_FORMATS:
            return self.unpack(_SCALAR_FORMATS[value_type], f"the value of {key}")
        if value_type == _STRING:
            return self.string(f"the value of {key}")
        if value_type == _ARRAY:
            if depth >= MAX_ARRAY_DEPTH:
                raise self.corrupt(f"{key} nests arrays deeper than {MAX_ARRAY_DEPTH}")
            item_type = self.unpack("<I", f"the item type of {key}")
            if item_type not in _MIN_VALUE_BYTES:
                raise self._unknown_type(item_type, key)
            count = self.count(f"items of {key}", _MIN_VALUE_BYTES[item_type], MAX_ARRAY_ITEMS)
            if item_type in _SCALAR_FORMATS:  # token types, scores: one bulk unpack
                return list(self.unpack_many(_SCALAR_FORMATS[item_type][1], count, f"the items of {key}"))
            if item_type == _STRING:  # a vocabulary, its merges: 150k+ strings each
                return self.strings(count, key)
            return [self.value(item_type, key, depth + 1) for _ in range(count)]
        raise self._unknown_type(value_type, key)

    def _unknown_type(self, value_type: int, key: str) -> ModelSourceError:
        return ModelSourceError(
            f"{self.path}: metadata {key!r} has a value of unknown type {value_type}; the file is corrupt or from a "
            "newer GGUF version. Re-download it or convert it with a current llama.cpp."
        )


def read_gguf(path: Path) -> GGUFFile:
    """Parse the header (metadata and tensor table) of a GGUF file without reading tensor data.

    Cached per file version: a model load asks for config, weights and tokenizer separately.
    """
    path = Path(path)
    if not path.is_file():
        raise ModelSourceError(f"GGUF file {path} does not exist. Check the profile's model path or run `inferplug pull`.")
    stat = path.stat()
    return _read_cached(path.resolve(), stat.st_size, stat.st_mtime_ns)


def clear_header_cache() -> None:
    """Forget parsed headers (benchmarks time cold parses)."""
    _read_cached.cache_clear()


@lru_cache(maxsize=4)
def _read_cached(path: Path, size: int, mtime_ns: int) -> GGUFFile:
    if size < len(GGUF_MAGIC) + 4 + 16:
        raise ModelSourceError(f"{path} is not a GGUF file: {size} bytes, shorter than a GGUF header. Re-download it.")
    try:
        with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
            return _parse(buffer, path)
    except OSError as exc:
        raise ModelSourceError(f"cannot read {path} ({exc.strerror or exc}); check the file and its permissions.") from None


def _parse(buffer, path: Path) -> GGUFFile:
    cursor = _Cursor(buffer, path)
    if bytes(buffer[:4]) != GGUF_MAGIC:
        raise ModelSourceError(f"{path} is not a GGUF file (bad magic bytes). Point the profile at a .gguf file.")
    cursor.pos = 4
    version = cursor.unpack("<I", "the version")
    if version not in (2, 3):
        raise ModelSourceError(f"{path} is GGUF version {version}; only versions 2 and 3 are supported.")
    tensor_count = cursor.unpack("<Q", "the tensor count")
    kv_count = cursor.count("metadata entries", _MIN_KV_BYTES)
    if tensor_count * _MIN_TENSOR_INFO_BYTES > cursor.size - cursor.pos:
        raise cursor.corrupt(f"{tensor_count} tensors cannot fit in a {cursor.size}-byte file")
    metadata: dict[str, Any] = {}
    for _ in range(kv_count):
        key = cursor.string("a metadata key")
        if key in metadata:
            raise cursor.corrupt(f"metadata key {key!r} appears twice")
        metadata[key] = cursor.value(cursor.unpack("<I", f"the value type of {key}"), key)
    if not isinstance(metadata.get("general.architecture"), str):
        raise ModelSourceError(f"{path} has no general.architecture string in its metadata; it is not a model GGUF.")

    raw_infos = []
    for _ in range(tensor_count):
        name = cursor.string("a tensor name")
        n_dims = cursor.unpack("<I", f"tensor {name}'s dimension count")
        if not 1 <= n_dims <= MAX_DIMS:
            raise cursor.corrupt(f"tensor {name} has {n_dims} dimensions; ggml allows 1 to {MAX_DIMS}")
        dims = cursor.unpack_many("Q", n_dims, f"tensor {name}'s dimensions")
        type_id, offset = cursor.unpack("<IQ", f"tensor {name}'s type and offset")
        raw_infos.append((name, dims, type_id, offset))

    alignment = _alignment(metadata, cursor)
    data_start = (cursor.pos + alignment - 1) // alignment * alignment
    tensors = {}
    for name, dims, type_id, offset in raw_infos:
        type_name = GGML_TYPE_NAMES.get(type_id)
        if type_name is None:
            raise ModelSourceError(
                f"{path}: tensor {name} uses ggml type {type_id}, which inferplug cannot dequantize. "
                f"Supported: {', '.join(GGML_TYPES)}. Use a GGUF quantized to one of those."
            )
        if name in tensors:
            raise cursor.corrupt(f"tensor {name} appears twice")
        _, block_elems, block_bytes = GGML_TYPES[type_name]
        if dims[0] % block_elems:
            raise cursor.corrupt(f"tensor {name}'s rows of {dims[0]} are not whole {type_name} blocks of {block_elems}")
        if offset % alignment:
            raise cursor.corrupt(f"tensor {name}'s offset {offset} is not a multiple of the alignment {alignment}")
        nbytes = math.prod(dims) // block_elems * block_bytes  # at most four u64 factors: no big-integer blowup
        start = data_start + offset
        if start + nbytes > cursor.size:
            raise ModelSourceError(f"{path} is truncated: tensor {name} ends past the end of the file. Re-download it.")
        tensors[name] = GGUFTensorInfo(name, tuple(reversed(dims)), type_name, start, nbytes)
    return GGUFFile(path, metadata, tensors)


def _alignment(metadata: dict[str, Any], cursor: _Cursor) -> int:
    """general.alignment: a power of two (the data section and every tensor offset are multiples of it)."""
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment < 1 or alignment & (alignment - 1):
        raise cursor.corrupt(f"general.alignment is {alignment!r}; it must be a power of two such as 32")
    return alignment
