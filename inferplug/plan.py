"""The resolver's answer (resolver.resolve): the backend, device, dtype, attention, KV cache and limits a profile runs
with on this hardware, each choice's reason and each backend not chosen with why not. A backend is built as
`Backend(profile, plan)`: the Plan is its whole run-time configuration."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferplug.memory_plan import MemoryBreakdown


@dataclass
class Plan:
    backend: str  # native | ctranslate2 | exllamav2 | openai
    device: str  # "cpu", "cuda:0", "cuda" (tensor parallel), "remote"
    dtype: str  # compute dtype: float32 | bfloat16 | float16
    attention: str  # native: ops.kernel_set's answer (cpu-kernels | torch | triton | flash); else the backend's own
    block_size: int = 16
    num_kv_blocks: int = 0
    max_model_len: int = 0
    max_num_seqs: int = 1
    max_num_batched_tokens: int = 0
    max_prefill_tokens_while_decoding: int = 0  # native: prefill tokens beside decode rows in a step (0: no cap)
    kv_dtype: str = "float32"
    compute_type: str | None = None  # CTranslate2's compute_type
    weight_format: str | None = None  # native: linears stored fp16/int8/int4 (quant/linear.py); None: in dtype
    tensor_parallel_size: int = 1
    threads_per_rank: int = 0  # native tensor parallel on a CPU: each rank's torch threads (parallel_plan.py)
    prefill_gemm: str = "float32"  # native: how int4/int8 block layers multiply prompt rows (quant/block_linear.py)
    onednn_max_isa: str | None = None  # native on a CPU: the ISA torch's oneDNN is held to (None: its own choice)
    prefix_caching: bool = True
    rag_document_cache: bool = False
    model_path: Path | None = None  # the local model, when it is already on disk
    memory: MemoryBreakdown | None = None
    reasons: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)  # backend -> why not

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["model_path"] = str(self.model_path) if self.model_path else None
        return data
