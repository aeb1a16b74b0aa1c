"""GGUF and safetensors headers as raw bytes, written field by field, so a test can make any of them hostile:
a count set huge, a dimension list 40k long, an alignment of 0, arrays nested a thousand deep."""

from __future__ import annotations

import json
import struct
from typing import Any

U8, U32, F32, STRING, ARRAY, U64 = 0, 4, 6, 8, 9, 10
_FORMATS = {U8: "<B", U32: "<I", F32: "<f", U64: "<Q"}


def gguf_string(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def gguf_value(value_type: int, value: Any) -> bytes:
    """A value's bytes after its type; an array's `value` is (item type, [items])."""
    if value_type == STRING:
        return gguf_string(value)
    if value_type == ARRAY:
        item_type, items = value
        return struct.pack("<IQ", item_type, len(items)) + b"".join(gguf_value(item_type, v) for v in items)
    return struct.pack(_FORMATS[value_type], value)


def gguf_kv(key: str, value_type: int, value: Any) -> bytes:
    return gguf_string(key) + struct.pack("<I", value_type) + gguf_value(value_type, value)


def gguf_tensor_info(name: str, dims: list[int], type_id: int, offset: int) -> bytes:
    return gguf_string(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, type_id, offset)


def gguf_file(kvs: list[bytes], infos: list[bytes], data: bytes = b"", *, alignment: int = 32,
              tensor_count: int | None = None, kv_count: int | None = None) -> bytes:
    """Magic, version 3, the counts (the real ones unless given), the entries, padding to `alignment`, `data`."""
    head = b"GGUF" + struct.pack("<IQQ", 3, len(infos) if tensor_count is None else tensor_count,
                                 len(kvs) if kv_count is None else kv_count) + b"".join(kvs) + b"".join(infos)
    return head + bytes(-len(head) % max(alignment, 1)) + data


LLAMA_KVS = [
    gguf_kv("general.architecture", STRING, "llama"),
    gguf_kv("llama.block_count", U32, 1),
    gguf_kv("llama.context_length", U32, 64),
    gguf_kv("llama.embedding_length", U32, 32),
    gguf_kv("llama.feed_forward_length", U32, 64),
    gguf_kv("llama.attention.head_count", U32, 4),
    gguf_kv("llama.attention.head_count_kv", U32, 2),
    gguf_kv("llama.vocab_size", U32, 8),
    gguf_kv("tokenizer.ggml.tokens", ARRAY, (STRING, ["<s>", "</s>", "a", "b"])),
    gguf_kv("tokenizer.ggml.scores", ARRAY, (F32, [0.0, 0.0, -1.0, -2.0])),
]


def small_gguf() -> bytes:
    """A valid GGUF header of a tiny llama: the metadata the config needs, a string and a float array, and two F32
    tensors (token_embd [8, 32] and output_norm [32]) with their data."""
    embd, norm = 8 * 32 * 4, 32 * 4
    infos = [gguf_tensor_info("token_embd.weight", [32, 8], 0, 0), gguf_tensor_info("output_norm.weight", [32], 0, embd)]
    return gguf_file(LLAMA_KVS, infos, (bytes(range(256)) * 5)[: embd + norm])


def safetensors_file(header: dict[str, Any] | bytes, data: bytes = b"", length: int | None = None) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


def small_safetensors() -> bytes:
    """A valid two-tensor safetensors file: a.weight F32 [2, 3] and b.bias BF16 [4]."""
    header = {"__metadata__": {"format": "pt"},
              "a.weight": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
              "b.bias": {"dtype": "BF16", "shape": [4], "data_offsets": [24, 32]}}
    return safetensors_file(header, bytes(range(32)))
