"""The engine's own knobs (the resolver's Plan fills them for the native backend)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineConfig:
    dtype: str = "float32"  # "float32", "bfloat16", "float16"
    device: str = "cpu"
    block_size: int = 16
    num_kv_blocks: int = 1024
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 1024
    enable_prefix_caching: bool = True  # False: no block hashing or prefix reuse (profile cache.prefix_caching)
    rag_document_cache: bool = True  # doc_cache: reuse RAG documents' KV given Request.documents
    speculative_method: str = "none"  # "ngram": prompt-lookup speculative decoding (engine/spec_decode.py)
    num_speculative_tokens: int = 4
    ngram_min: int = 1
    ngram_max: int = 3

    @property
    def torch_dtype(self):
        import torch

        names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
                 "float16": torch.float16, "fp16": torch.float16, "half": torch.float16}
        if str(self.dtype) not in names:
            raise ValueError(f"dtype {self.dtype!r} is not supported by the native engine; use one of {sorted(names)}")
        return names[str(self.dtype)]
