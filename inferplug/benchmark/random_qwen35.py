"""A real-size Qwen3.5 GGUF of random weights, in llama.cpp's qwen35 layout (conversion/qwen.py Qwen3_5TextModel) and
its Q4_K_M mix: Gated DeltaNet layers (attn_qkv, attn_gate, ssm_alpha / ssm_beta, ssm_conv1d, ssm_a as -exp(A_log),
ssm_dt, ssm_norm, ssm_out) with every fourth layer attending (q and its output gate in attn_q, QK norms), partial RoPE
on a quarter of each head, an untied head. Qwen3.5-MoE's (qwen35moe): every layer's MLP its experts (an F32 router,
3-D expert tensors) and a shared expert with its F32 gate.

    write_random_qwen35_gguf(out, config, tokenizer_metadata)
"""

from __future__ import annotations

import numpy as np

from inferplug.benchmark.random_models import add_geometry, add_metadata, write_tensors
from inferplug.models.config import ModelConfig
from inferplug.models.gguf_random import q4_k_m_type


def write_random_qwen35_gguf(out, config: ModelConfig, tokenizer_metadata: dict, seed: int = 0) -> None:
    """`config`: a Qwen3.5 ModelConfig (models/families/qwen35.py's fields; qwen35_moe.py's with experts)."""
    import gguf

    layers, hidden, heads, dim = config.num_hidden_layers, config.hidden_size, config.num_attention_heads, \
        config.head_dim
    key, value, channels = config.delta_net_sizes()
    value_heads = config.linear_num_value_heads
    experts, inter = config.num_experts, config.moe_intermediate_size
    writer = gguf.GGUFWriter(out, "qwen35moe" if experts else "qwen35")
    add_geometry(writer, config, config.num_key_value_heads)
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(config.num_experts_per_tok)
        writer.add_expert_feed_forward_length(inter)
        writer.add_expert_shared_feed_forward_length(config.shared_expert_intermediate_size)
    writer.add_key_length(dim)
    writer.add_value_length(dim)
    writer.add_rope_dimension_count(int(dim * config.rope_scaling["partial_rotary_factor"]))
    writer.add_rope_dimension_sections([11, 11, 10, 0])  # the converter's default: plain RoPE for text
    writer.add_ssm_conv_kernel(config.linear_conv_kernel_dim)
    writer.add_ssm_state_size(config.linear_key_head_dim)
    writer.add_ssm_group_count(config.linear_num_key_heads)
    writer.add_ssm_time_step_rank(value_heads)
    writer.add_ssm_inner_size(value)
    writer.add_full_attention_interval(next(i + 1 for i in range(layers) if not config.is_linear_layer(i)))
    add_metadata(writer, tokenizer_metadata)

    rng = np.random.default_rng(seed)
    floats = [("output_norm.weight", (hidden,), None)]
    matrices = [("token_embd.weight", layers - 1, (config.vocab_size, hidden)),
                ("output.weight", layers - 1, (config.vocab_size, hidden))]
    dense, shared = config.intermediate_size, config.shared_expert_intermediate_size
    for i in range(layers):
        floats += [(f"blk.{i}.{n}.weight", (hidden,), None) for n in ("attn_norm", "post_attention_norm")]
        shapes = {"ffn_gate": (dense, hidden), "ffn_up": (dense, hidden), "ffn_down": (hidden, dense)}
        if experts:  # each expert tensor (experts, out, in): its experts' matrices one after another
            floats += [(f"blk.{i}.ffn_gate_inp.weight", (experts, hidden), hidden**-0.5),
                       (f"blk.{i}.ffn_gate_inp_shexp.weight", (hidden,), hidden**-0.5)]
            shapes = {"ffn_gate_exps": (experts * inter, hidden), "ffn_up_exps": (experts * inter, hidden),
                      "ffn_down_exps": (experts * hidden, inter), "ffn_gate_shexp": (shared, hidden),
                      "ffn_up_shexp": (shared, hidden), "ffn_down_shexp": (hidden, shared)}
        if config.is_linear_layer(i):  # decay rates as -exp(A_log) for A in [1, 16], HF's init
            floats += [(f"blk.{i}.ssm_a", (value_heads,), -rng.uniform(1.0, 16.0, value_heads)),
                       (f"blk.{i}.ssm_dt.bias", (value_heads,), None),
                       (f"blk.{i}.ssm_conv1d.weight", (channels, config.linear_conv_kernel_dim), 0.5),
                       (f"blk.{i}.ssm_norm.weight", (config.linear_value_head_dim,), None)]
            shapes |= {"attn_qkv": (channels, hidden), "attn_gate": (value, hidden),
                       "ssm_alpha": (value_heads, hidden), "ssm_beta": (value_heads, hidden),
                       "ssm_out": (hidden, value)}
        else:
            kv = config.num_key_value_heads * dim
            floats += [(f"blk.{i}.{n}.weight", (dim,), None) for n in ("attn_q_norm", "attn_k_norm")]
            shapes |= {"attn_q": (2 * heads * dim, hidden), "attn_k": (kv, hidden), "attn_v": (kv, hidden),
                       "attn_output": (hidden, heads * dim)}
        matrices += [(f"blk.{i}.{part}.weight", i, shape) for part, shape in shapes.items()]
    write_tensors(writer, floats, matrices, lambda name, layer: q4_k_m_type(name, layer, layers), experts, seed)
