"""Gemma 3 (270M-27B): Llama's decoder with
- norms that scale by 1 + w, and sandwich norms (after attention and after the MLP, before each residual add);
- QK RMSNorm; the embedding times sqrt(hidden); GeGLU;
- five sliding-window layers (their own RoPE base, 10k) to every full layer (1M base, linear scaling on 4B+);
- attention scaled by query_pre_attn_scalar ** -0.5.
HF's modular_gemma3.py and llama.cpp's src/models/gemma3.cpp are the references."""

from typing import Any

from inferplug.models.family import Family

SLIDING_PATTERN = 6  # llama.cpp's set_swa_pattern(6): every sixth layer full, the rest windowed


def hf_fields(raw: dict[str, Any]) -> dict[str, Any]:
    layers, window = raw["num_hidden_layers"], raw.get("sliding_window") or 0
    kinds = raw.get("layer_types") or ["full_attention" if (i + 1) % SLIDING_PATTERN == 0 else "sliding_attention"
                                       for i in range(layers)]
    rope = raw.get("rope_parameters") or {}
    local = (rope.get("sliding_attention") or {}).get("rope_theta", raw.get("rope_local_base_freq", 10000.0))
    heads = raw["num_attention_heads"]
    scalar = raw.get("query_pre_attn_scalar") or (raw.get("head_dim") or raw["hidden_size"] // heads)
    return {"layer_windows": tuple(window if kind == "sliding_attention" else 0 for kind in kinds),
            "sliding_window": None,  # per layer instead of the whole model's (Mistral's)
            "rope_local_theta": float(local), "attention_scale": float(scalar) ** -0.5,
            "final_logit_softcap": raw.get("final_logit_softcapping")}


def gguf_fields(gguf) -> dict[str, Any]:
    layers, window = gguf.arch_count("block_count"), gguf.arch_count("attention.sliding_window")
    head_dim = gguf.arch_count("attention.key_length")
    if gguf.arch_key("block_count") == 62:  # 27B: llama.cpp scales by hidden / heads, as HF's query_pre_attn_scalar
        head_dim = gguf.arch_count("embedding_length") // gguf.arch_count("attention.head_count")
    return {"layer_windows": tuple(0 if (i + 1) % SLIDING_PATTERN == 0 else window for i in range(layers)),
            "sliding_window": None,  # per layer instead of the whole model's (Mistral's)
            "rope_local_theta": float(gguf.arch_key("rope.freq_base_swa", 10000.0)),
            "attention_scale": float(head_dim) ** -0.5,
            "final_logit_softcap": gguf.arch_key("final_logit_softcapping")}


FAMILY = Family(
    name="gemma3",
    hf_model_types=("gemma3_text",),
    gguf_architectures=("gemma3",),
    qk_norm=True,
    norms_plus_one=True,
    sandwich_norms=True,
    scaled_embedding=True,
    activation="gelu_tanh",
    gguf_layer_names={"post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
                      "post_ffw_norm": "post_feedforward_layernorm"},
    fused_decode=True,  # decode_layers takes its sandwich norms, windows, local RoPE and GeGLU
    hf_fields=hf_fields,
    gguf_fields=gguf_fields,
)
