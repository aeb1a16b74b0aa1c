"""The model families the native engine runs, by GGUF general.architecture and by HF model_type.

A new family is one module in models/families/ and one entry in FAMILIES (see docs/architecture.md)."""

from __future__ import annotations

from inferplug.errors import ModelSourceError
from inferplug.models.families import gemma3, gemma4, gpt_oss, llama, qwen3, qwen3_moe, qwen35, qwen35_moe
from inferplug.models.family import Family

FAMILIES: tuple[Family, ...] = (llama.FAMILY, qwen3.FAMILY, qwen3_moe.FAMILY, gemma3.FAMILY, gpt_oss.FAMILY,
                                gemma4.FAMILY, qwen35.FAMILY, qwen35_moe.FAMILY)
_BY_NAME = {f.name: f for f in FAMILIES}
_BY_HF = {t: f for f in FAMILIES for t in f.hf_model_types}
_BY_GGUF = {a: f for f in FAMILIES for a in f.gguf_architectures}
# llama.cpp's converter interleaves Q/K rows only for these (its LlamaModel.permute); qwen2's are left as HF's
_GGUF_UNPERMUTED = ("qwen2",)


def family(name: str) -> Family:
    return _BY_NAME[name]


def runs_document_cache(opted_in: bool, family_name: str, tensor_parallel_size: int) -> bool:
    """Whether the native engine runs the RAG document cache (engine/doc_cache.py): opted in, for a family it takes,
    on one rank (it copies KV on rank 0 only). LLMEngine and the memory plan decide by it: with it, sliding-window
    layers keep the whole context (a document's every layer is stored)."""
    return opted_in and tensor_parallel_size == 1 and not (family_name and family(family_name).document_cache_why)


def hf_family(model_type: str | None) -> Family:
    if model_type not in _BY_HF:
        raise ModelSourceError(f"model_type {model_type!r} is not supported by the native engine; it runs "
                               f"{', '.join(_BY_HF)}. Use one of those models or another backend.")
    return _BY_HF[model_type]


def gguf_family(architecture: str, path) -> Family:
    if architecture not in _BY_GGUF:
        raise ModelSourceError(f"{path} holds a {architecture!r} model; inferplug's native engine runs "
                               f"{', '.join(_BY_GGUF)}. Pick a GGUF of one of those families.")
    return _BY_GGUF[architecture]


def gguf_interleaved_rope(architecture: str) -> bool:
    """Whether llama.cpp's converter interleaved this file's Q/K rows (undone at load)."""
    return _BY_GGUF[architecture].gguf_interleaved_rope and architecture not in _GGUF_UNPERMUTED
