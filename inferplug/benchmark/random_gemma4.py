"""A real-size Gemma 4 GGUF of random weights, in llama.cpp's Gemma 4 layout (conversion/gemma.py Gemma4Model) and
its Q4_K_M mix: window and full layers of their own head sizes and KV heads (V from K on the full ones), the full
layers' proportional RoPE factors (rope_freqs), sandwich and QK norms, layer output scales, and 26B-A4B's experts
beside a dense MLP (gate and up in one 3-D tensor, a router input scale and an output scale per expert). Rows whose
width is not a multiple of 256 take llama.cpp's fallback for a K-quant (Q4_K -> Q5_0, Q6_K -> Q8_0), as its quantizer
does for 26B-A4B's 704- and 2112-wide rows.

    write_random_gemma4_gguf(out, config, tokenizer_metadata)
"""

from __future__ import annotations

import numpy as np

from inferplug.benchmark.random_models import add_geometry, add_metadata, write_tensors
from inferplug.models.config import ModelConfig
from inferplug.models.gguf_random import q4_k_m_type

K_QUANT_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}  # llama-quant.cpp, rows not 256-wide


def write_random_gemma4_gguf(out, config: ModelConfig, tokenizer_metadata: dict, seed: int = 0) -> None:
    """`config`: a Gemma 4 ModelConfig (models/families/gemma4.py's fields) without shared KV or per-layer inputs
    (26B-A4B's and 31B's kind); the embedding tied to the head, as Gemma's are."""
    import gguf

    layers, hidden, heads = config.num_hidden_layers, config.hidden_size, config.num_attention_heads
    windows = [config.window(i) for i in range(layers)]
    full_dim = next(config.head_dim_of(i) for i in range(layers) if not windows[i])
    writer = gguf.GGUFWriter(out, "gemma4")
    add_geometry(writer, config, [config.kv_heads_of(i) for i in range(layers)])
    writer.add_rope_freq_base_swa(config.rope_local_theta)
    writer.add_key_length(full_dim)
    writer.add_value_length(full_dim)
    writer.add_key_length_swa(config.head_dim)
    writer.add_value_length_swa(config.head_dim)
    writer.add_rope_dimension_count(full_dim)
    writer.add_rope_dimension_count_swa(config.head_dim)
    writer.add_sliding_window(max(windows))
    writer.add_sliding_window_pattern([bool(w) for w in windows])
    writer.add_shared_kv_layers(0)
    writer.add_embedding_length_per_layer_input(0)
    writer.add_final_logit_softcapping(config.final_logit_softcap)
    experts = config.num_experts
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(config.num_experts_per_tok)
        writer.add_expert_feed_forward_length(config.moe_intermediate_size)
    add_metadata(writer, tokenizer_metadata)

    rotated = int(config.rope_scaling["partial_rotary_factor"] * full_dim // 2)
    factors = np.array([1.0] * rotated + [1e30] * (full_dim // 2 - rotated))  # the converter's: 1e30 leaves a pair
    floats = [("rope_freqs.weight", (full_dim // 2,), factors), ("output_norm.weight", (hidden,), None)]
    matrices = [("token_embd.weight", layers - 1, (config.vocab_size, hidden))]
    inter, moe_inter = config.intermediate_size, config.moe_intermediate_size
    for i in range(layers):
        dim, kv = config.head_dim_of(i), config.kv_heads_of(i) * config.head_dim_of(i)
        norms = ["attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"]
        norms += ["pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"] if experts else []
        floats += [(f"blk.{i}.{n}.weight", (hidden,), None) for n in norms]
        floats += [(f"blk.{i}.{n}.weight", (dim,), None) for n in ("attn_q_norm", "attn_k_norm")]
        floats.append((f"blk.{i}.layer_output_scale.weight", (1,), None))
        shapes = {"attn_q": (heads * dim, hidden), "attn_k": (kv, hidden), "attn_v": (kv, hidden),
                  "attn_output": (hidden, heads * dim), "ffn_gate": (inter, hidden), "ffn_up": (inter, hidden),
                  "ffn_down": (hidden, inter)}
        if config.v_from_k[i]:
            del shapes["attn_v"]
        if experts:  # the router (F32), its input scale, each expert's output scale; the experts 3-D
            floats += [(f"blk.{i}.ffn_gate_inp.weight", (experts, hidden), hidden**-0.5),
                       (f"blk.{i}.ffn_gate_inp.scale", (hidden,), None), (f"blk.{i}.ffn_down_exps.scale", (experts,), None)]
            shapes |= {"ffn_gate_up_exps": (experts * 2 * moe_inter, hidden), "ffn_down_exps": (experts * hidden, moe_inter)}
        matrices += [(f"blk.{i}.{part}.weight", i, shape) for part, shape in shapes.items()]
    widths = {name: cols for name, _, (_, cols) in matrices}

    def type_of(name: str, layer: int) -> str:
        kind = "Q6_K" if name == "token_embd.weight" else q4_k_m_type(name, layer, layers)  # tied: the head's type
        return K_QUANT_FALLBACK.get(kind, kind) if widths[name] % 256 else kind

    write_tensors(writer, floats, matrices, type_of, experts, seed)
