"""Qwen3 (0.6B-32B): Llama's decoder with a per-head RMSNorm on q and k before RoPE (HF's modular_qwen3.py)."""

from inferplug.models.family import Family

FAMILY = Family(
    name="qwen3",
    hf_model_types=("qwen3",),
    gguf_architectures=("qwen3",),
    qk_norm=True,
    fused_decode=True,  # decode_layers takes QK-norm
)
