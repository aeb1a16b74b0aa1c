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
import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferplug.errors import ModelSourceError

if TYPE_CHECKING:
    import torch

HEADER_LIMIT = 100 << 20  # safetensors' own limit on the JSON header
MAX_RANK = 8  # dimensions a tensor may have (checkpoints use at most 4)
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
        except (ValueError, KeyError, AttributeError, TypeError, RecursionError) as exc:
            raise ModelSourceError(f"{index} is not a safetensors index ({exc}); re-download the model.") from exc
        for shard in shards:
            check_shard_name(model_dir, shard, index)
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


def check_shard_name(model_dir: Path, shard: Any, index: Path) -> None:
    """An index may only name plain *.safetensors file names in the model dir: no path, no "..", and no symlink that
    leads out of the dir (in a Hugging Face cache snapshot: out of that repo's blobs, where its links point)."""
    if not isinstance(shard, str) or Path(shard).name != shard or "\\" in shard or not shard.endswith(".safetensors"):
        raise ModelSourceError(f"{index} names the shard {str(shard)[:120]!r}, which is no plain .safetensors file name "
                               "in the model dir; the index is damaged or hostile. Re-download the model.")
    target, roots = (model_dir / shard).resolve(), [model_dir.resolve()]
    if model_dir.resolve().parent.name == "snapshots":
        roots.append(model_dir.resolve().parent.parent / "blobs")
    if (model_dir / shard).exists() and not any(target.is_relative_to(root) for root in roots):
        raise ModelSourceError(f"{index}: shard {shard} is a symlink to {target}, outside the model dir; inferplug "
                               "reads no weights from outside it. Copy the shard into the dir.")


def read_header(file: Path) -> dict[str, TensorRef]:
    """The file's tensors (ModelSourceError for a damaged file: a bad header or data past its end)."""
    try:
        with file.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise ValueError(f"a {size}-byte file has no header length")
            (length,) = struct.unpack("<Q", head)
            if not 2 <= length <= min(HEADER_LIMIT, size - 8):
                raise ValueError(f"header length {length} in a {size}-byte file (at most {HEADER_LIMIT >> 20} MiB)")
            header = json.loads(f.read(length))
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: JSON nested thousands deep
        raise ModelSourceError(f"{file} is not a readable safetensors file ({exc}); re-download it.") from exc
    if not isinstance(header, dict):
        raise ModelSourceError(f"{file} is not a readable safetensors file (its header is a JSON "
                               f"{type(header).__name__}, not an object); re-download it.")
    start = 8 + length
    return {name: _tensor_ref(file, name, entry, start, size) for name, entry in header.items()
            if name != "__metadata__"}


def _tensor_ref(file: Path, name: str, entry: Any, start: int, size: int) -> TensorRef:
    """One header entry, checked: a known dtype, a shape of at most MAX_RANK non-negative ints, and data offsets that
    hold exactly that many bytes inside the file."""
    def bad(problem: str) -> ModelSourceError:
        return ModelSourceError(f"{file} is not a readable safetensors file (tensor {name!r}: {problem}); "
                                "re-download it.")

    if not isinstance(entry, dict) or not isinstance(entry.get("dtype"), str) or entry["dtype"] not in DTYPES:
        raise bad(f"no known dtype in {str(entry)[:80]}; known: {', '.join(DTYPES)}")
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if not isinstance(shape, list) or len(shape) > MAX_RANK or not all(_is_count(n) for n in shape):
        raise bad(f"shape {str(shape)[:80]} is not a list of at most {MAX_RANK} non-negative integers")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(n) for n in offsets):
        raise bad(f"data_offsets {str(offsets)[:80]} is not two non-negative integers")
    dtype, (begin, end) = DTYPES[entry["dtype"]], offsets
    if end - begin != math.prod(shape) * _itemsize(dtype) or start + end > size:
        raise bad(f"bytes {begin}..{end} do not fit its shape {shape} or the file")
    return TensorRef(file, dtype, tuple(shape), start + begin, end - begin)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


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
