"""The engine's own knobs (the resolver's Plan fills them for the native backend)."""

from __future__ import annotations

from dataclasses import dataclass

from inferplug.models.config import STATE_SNAPSHOTS


@dataclass
class EngineConfig:
    dtype: str = "float32"  # "float32", "bfloat16", "float16"
    device: str = "cpu"
    block_size: int = 16
    num_kv_blocks: int = 1024
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 1024
    max_prefill_tokens_while_decoding: int = 0  # prefill tokens a step with decode rows may carry (0: no cap)
    enable_prefix_caching: bool = True  # False: no block hashing or prefix reuse (profile cache.prefix_caching)
    state_snapshots: int = STATE_SNAPSHOTS  # a hybrid model's prefix cache: DeltaNet states kept (state_snapshots.py)
    rag_document_cache: bool = True  # doc_cache: reuse RAG documents' KV given Request.documents
    rag_recompute: str = "none"  # rag_recompute.py: "deviation" | "chunk_heads" | "none", what of a reused document
    rag_recompute_fraction: float = 0.0  # is computed again: this fraction of each one's tokens
    schedule: str = "fifo"  # "cache_aware": admit waiting requests with cached tokens first (engine/cache_aware.py)
    rag_disk_dir: str | None = None  # doc_disk: the document KV disk tier's folder (None: no disk tier)
    rag_disk_bytes: int = 0  # its bound (0: no disk tier)
    rag_shared_salt: str | None = None  # the salt a corpus shared by every tenant is stored under (doc_cache)
    model_identity: str = ""  # the weights that make this engine's KV (doc_disk_key.model_identity): keys the disk tier
    speculative_method: str = "none"  # "ngram": prompt-lookup speculative decoding (engine/spec_decode.py)
    num_speculative_tokens: int = 4
    ngram_min: int = 1
    ngram_max: int = 3
    attention: str = "auto"  # ops.kernel_set: auto | cpu-kernels | torch | triton | flash
    kv_dtype: str | None = None  # the KV pools' dtype; None: the compute dtype. float8_e4m3 needs CUDA
    weight_format: str | None = None  # the linears' weight-only format (quant/linear.py), made before the KV pools
    prefill_gemm: str = "float32"  # how block layers multiply prompt rows (quant/block_linear.PREFILL_GEMMS)
    cuda_graphs: bool = True  # decode steps replay captured CUDA graphs (Triton attention on CUDA only)
    window_kv_blocks: int = 0  # the sliding-window layers' own pools (engine/window_blocks.py); the engine sets it
    tensor_parallel_size: int = 1  # >1: engine/parallel, one process per rank (gloo on CPU, NCCL on CUDA)
    threads_per_rank: int = 0  # tensor parallel on CPU: torch threads of each rank (0: torch's default)

    @property
    def torch_dtype(self):
        import torch

        names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
                 "float16": torch.float16, "fp16": torch.float16, "half": torch.float16}
        if str(self.dtype) not in names:
            raise ValueError(f"dtype {self.dtype!r} is not supported by the native engine; use one of {sorted(names)}")
        return names[str(self.dtype)]

    @property
    def torch_kv_dtype(self):
        """The pools' torch dtype. fp8 (e4m3) pools store a scale-free cast and are read back upcast."""
        import torch

        if self.kv_dtype is None or self.kv_dtype == "auto":
            return self.torch_dtype
        if self.kv_dtype in ("float8_e4m3", "fp8", "fp8_e4m3"):
            if not str(self.device).startswith("cuda"):
                raise ValueError(f"kv_dtype {self.kv_dtype!r} (fp8) needs a CUDA device, not {self.device!r}; use "
                                 "float16, bfloat16 or float32 on the CPU")
            return torch.float8_e4m3fn
        return EngineConfig(dtype=self.kv_dtype).torch_dtype
