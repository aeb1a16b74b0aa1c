"""An HF dir's safetensors shards read one tensor at a time, so a load never holds the whole checkpoint.

    safetensors_files(model_dir) -> the shards (the index's, or every *.safetensors)
    SafetensorsTensors(files)    -> a lazy mapping: names from the headers; `pop(name)` reads that tensor

Each tensor is read with readinto into its own buffer, not through a mapping of the file: pages of a mapping that
were read stay in the process's resident set (as safetensors' `safe_open` maps the whole file), so mapping a 4 GB
checkpoint would add 4 GB to the peak memory the memory plan promised.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from inferplug.errors import ModelSourceError

if TYPE_CHECKING:
    import torch

HEADER_LIMIT = 100 << 20  # safetensors' own limit on the JSON header
DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64", "I32": "int32",
          "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}
SKIPPED_SUFFIX = "rotary_emb.inv_freq"  # recomputed by the model, never loaded


@dataclass(frozen=True)
class TensorRef:
    file: Path
    dtype: str  # a torch dtype name
    shape: tuple[int, ...]
    offset: int  # from the file's start
    nbytes: int


def safetensors_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, AttributeError) as exc:
            raise ModelSourceError(f"{index} is not a safetensors index ({exc}); re-download the model.") from exc
        missing = [s for s in shards if not (model_dir / s).is_file()]
        if missing:
            raise ModelSourceError(f"{model_dir} lacks shards {missing} listed in its index; re-download the model.")
        return [model_dir / s for s in shards]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelSourceError(
            f"{model_dir} has no .safetensors weights (PyTorch .bin checkpoints are not supported); "
            "convert it with `save_pretrained(..., safe_serialization=True)`."
        )
    return files


def read_header(file: Path) -> dict[str, TensorRef]:
    """The file's tensors (ModelSourceError for a damaged file: a bad header or data past its end)."""
    try:
        with file.open("rb") as f:
            size = file.stat().st_size
            (length,) = struct.unpack("<Q", f.read(8))
            if not 2 <= length <= min(HEADER_LIMIT, size - 8):
                raise ValueError(f"header length {length} in a {size}-byte file")
            header = json.loads(f.read(length))
    except (OSError, ValueError, struct.error) as exc:
        raise ModelSourceError(f"{file} is not a readable safetensors file ({exc}); re-download it.") from exc
    refs, start = {}, 8 + length
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = DTYPES[entry["dtype"]], tuple(entry["shape"]), entry["data_offsets"]
            itemsize = _itemsize(dtype)
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelSourceError(f"{file} is not a readable safetensors file (tensor {name}: {exc!r}); "
                                   "re-download it.") from exc
        if end - begin != math.prod(shape) * itemsize or begin < 0 or start + end > size:
            raise ModelSourceError(f"{file} is not a readable safetensors file (tensor {name}'s bytes {begin}..{end} "
                                   f"do not fit its shape {list(shape)} or the file); re-download it.")
        refs[name] = TensorRef(file, dtype, shape, start + begin, end - begin)
    return refs


class SafetensorsTensors:
    """Every tensor of the shards, rotary tables aside; `pop` reads one (on the CPU) and forgets it.
    `on_read(name)` runs after each read (the loader's progress bar)."""

    def __init__(self, files: list[Path], on_read: Callable[[str], None] | None = None):
        self._refs: dict[str, TensorRef] = {}
        for file in files:
            self._refs.update({n: r for n, r in read_header(file).items() if not n.endswith(SKIPPED_SUFFIX)})
        self._on_read = on_read

    def __contains__(self, name: object) -> bool:
        return name in self._refs

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._refs))

    def __len__(self) -> int:
        return len(self._refs)

    def pop(self, name: str, *default):
        if name not in self._refs and default:
            return default[0]
        tensor = read_tensor(self._refs.pop(name))
        if self._on_read is not None:
            self._on_read(name)
        return tensor


def read_tensor(ref: TensorRef) -> "torch.Tensor":
    import torch

    tensor = torch.empty(ref.shape, dtype=getattr(torch, ref.dtype))
    buffer = memoryview(tensor.view(-1).view(torch.uint8).numpy()) if ref.nbytes else memoryview(b"")
    try:
        with ref.file.open("rb", buffering=0) as f:
            f.seek(ref.offset)
            done = 0
            while done < ref.nbytes:  # readinto may return less than asked
                got = f.readinto(buffer[done:])
                if not got:
                    raise OSError(f"the file ends {ref.nbytes - done} bytes early")
                done += got
    except OSError as exc:
        raise ModelSourceError(f"{ref.file} is not a readable safetensors file ({exc}); re-download it.") from exc
    return tensor


def _itemsize(dtype: str) -> int:
    import torch

    return getattr(torch, dtype).itemsize
