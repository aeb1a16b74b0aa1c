"""What a stored document KV entry depends on besides its tokens and salt: the disk tier's namespace.

    model_identity(path, load_format, weight_format, prefill_gemm) -> the weights that make the KV, as a string
    open_disk_tier(config, model_config, kv_dtype)                  -> the engine's DocumentKVDisk, or None (off)

An entry is read only under the namespace it was written in: the model files (the sha256 `inferplug pull` recorded,
else path, size and mtime), how their linears run (weight format, prefill GEMM), the compute and KV dtypes, the
block size, the model's geometry and RoPE configuration, the engine version and DOC_KV_VERSION. So another model, a
changed file or an upgrade misses its old entries (which age out), never reads them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from importlib.metadata import version
from pathlib import Path
from typing import Any

from inferplug.engine.doc_disk import DocumentKVDisk

DOC_KV_VERSION = 1  # bump when what the engine stores for a segment changes meaning


def model_identity(path: Path, load_format: str = "auto", weight_format: str | None = None,
                   prefill_gemm: str = "float32") -> str:
    from inferplug.models.conversion_cache import file_identity
    from inferplug.models.loader import gguf_file_of
    from inferplug.models.safetensors_reader import safetensors_files

    path = Path(path)
    gguf = gguf_file_of(path)
    if gguf is not None:
        files = [gguf]
    elif load_format == "dummy":  # seeded random weights: the config names them
        files = [path / "config.json"]
    else:
        files = [path / "config.json", *safetensors_files(path)]
    return json.dumps({"files": [file_identity(f) for f in files], "load_format": load_format,
                       "weight_format": weight_format, "prefill_gemm": prefill_gemm})


def open_disk_tier(config: Any, model_config: Any, kv_dtype: Any) -> DocumentKVDisk | None:
    """config: the EngineConfig (rag_disk_dir, rag_disk_bytes, model_identity); None when the tier is off."""
    if not config.rag_disk_bytes or config.rag_disk_dir is None:
        return None
    if not config.model_identity:
        raise ValueError("the document KV disk tier needs EngineConfig.model_identity (doc_disk_key.model_identity) "
                         "so that another model never reads its entries")
    parts = {"version": DOC_KV_VERSION, "engine": version("inferplug"), "model": config.model_identity,
             "dtype": config.dtype, "kv_dtype": str(kv_dtype), "block_size": config.block_size,
             "geometry": dataclasses.asdict(model_config)}  # RoPE theta and scaling, heads, layers
    namespace = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()
    return DocumentKVDisk(Path(config.rag_disk_dir), config.rag_disk_bytes, namespace)
