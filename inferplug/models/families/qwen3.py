"""Qwen3 (0.6B-32B): Llama's decoder with a per-head RMSNorm on q and k before RoPE (HF's modular_qwen3.py)."""

from inferplug.models.family import Family

FAMILY = Family(
    name="qwen3",
    hf_model_types=("qwen3",),
    gguf_architectures=("qwen3",),
    qk_norm=True,
    fused_decode=True,  # decode_layers takes QK-norm
    gguf_layer_names={"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"},
)
