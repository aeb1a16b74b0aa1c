"""Reading GGUF files: metadata, the tensor table and memory-mapped tensor bytes.

Our own parser instead of `gguf.GGUFReader`: that one builds a numpy view per metadata array
element, which takes ~10 s on a 49k-token vocabulary; this one reads the header in well under
a second and never touches tensor data until a tensor is asked for.
Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
"""

from __future__ import annotations

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

    def read_tensor(self, handle, info: GGUFTensorInfo):
        """The raw bytes of one tensor, read from `handle` (this file, opened "rb") into a fresh uint8 torch tensor.
        Read, not mapped: a mapping's pages would count in the process's RSS beside the converted weights."""
        import torch

        raw = torch.empty(info.nbytes, dtype=torch.uint8)
        handle.seek(info.offset)
        if handle.readinto(raw.numpy()) != info.nbytes:
            raise ModelSourceError(f"{self.path} is truncated at tensor {info.name}; re-download it.")
        return raw


class _Cursor:
    def __init__(self, buffer, path: Path):
        self.buffer, self.pos, self.path = buffer, 0, path

    def _take(self, fmt: str) -> tuple:
        values = struct.unpack_from(fmt, self.buffer, self.pos)
        self.pos += struct.calcsize(fmt)
        return values

    def unpack(self, fmt: str):
        values = self._take(fmt)
        return values if len(values) > 1 else values[0]

    def unpack_many(self, code: str, count: int) -> tuple:
        """`count` values of one struct type code (e.g. "Q"): tensor dims, scalar metadata arrays."""
        return self._take(f"<{count}{code}")

    def string(self) -> str:
        length = self.unpack("<Q")
        start, self.pos = self.pos, self.pos + length
        return bytes(self.buffer[start : self.pos]).decode("utf-8", errors="replace")

    def value(self, value_type: int) -> Any:
        if value_type in _SCALAR_FORMATS:
            return self.unpack(_SCALAR_FORMATS[value_type])
        if value_type == _STRING:
            return self.string()
        if value_type == _ARRAY:
            item_type, count = self.unpack("<IQ")
            if item_type in _SCALAR_FORMATS:  # token types, scores: one bulk unpack
                return list(self.unpack_many(_SCALAR_FORMATS[item_type][1], count))
            return [self.value(item_type) for _ in range(count)]
        raise ModelSourceError(
            f"{self.path} has a metadata value of unknown type {value_type}; the file is corrupt or from a "
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
    try:
        with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
            return _parse(buffer, path)
    except (struct.error, UnicodeDecodeError, ValueError, IndexError) as exc:
        raise ModelSourceError(
            f"{path} is not a readable GGUF file ({exc}); it is truncated or corrupt. Re-download it."
        ) from exc


def _parse(buffer, path: Path) -> GGUFFile:
    cursor = _Cursor(buffer, path)
    if bytes(buffer[:4]) != GGUF_MAGIC:
        raise ModelSourceError(f"{path} is not a GGUF file (bad magic bytes). Point the profile at a .gguf file.")
    cursor.pos = 4
    version = cursor.unpack("<I")
    if version not in (2, 3):
        raise ModelSourceError(f"{path} is GGUF version {version}; only versions 2 and 3 are supported.")
    tensor_count, kv_count = cursor.unpack("<QQ")
    metadata: dict[str, Any] = {}
    for _ in range(kv_count):
        key = cursor.string()
        metadata[key] = cursor.value(cursor.unpack("<I"))
    if "general.architecture" not in metadata:
        raise ModelSourceError(f"{path} has no general.architecture in its metadata; it is not a model GGUF.")

    raw_infos = []
    for _ in range(tensor_count):
        name = cursor.string()
        n_dims = cursor.unpack("<I")
        dims = cursor.unpack_many("Q", n_dims)
        type_id, offset = cursor.unpack("<IQ")
        raw_infos.append((name, tuple(reversed(dims)), type_id, offset))

    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    data_start = (cursor.pos + alignment - 1) // alignment * alignment
    tensors = {}
    for name, shape, type_id, offset in raw_infos:
        type_name = GGML_TYPE_NAMES.get(type_id)
        if type_name is None:
            raise ModelSourceError(
                f"{path}: tensor {name} uses ggml type {type_id}, which inferplug cannot dequantize. "
                f"Supported: {', '.join(GGML_TYPES)}. Use a GGUF quantized to one of those."
            )
        _, block_elems, block_bytes = GGML_TYPES[type_name]
        elements = 1
        for dim in shape:
            elements *= dim
        nbytes = elements // block_elems * block_bytes
        start = data_start + offset
        if start + nbytes > len(buffer):
            raise ModelSourceError(f"{path} is truncated: tensor {name} ends past the end of the file. Re-download it.")
        tensors[name] = GGUFTensorInfo(name, shape, type_name, start, nbytes)
    return GGUFFile(path, metadata, tensors)
