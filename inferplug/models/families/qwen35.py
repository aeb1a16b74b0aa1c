"""Qwen3.5 / 3.6 dense (0.8B-27B): a hybrid stack. Three layers in four (or as layer_types says) are Gated DeltaNet
(models/delta_net.py), a recurrence whose fixed-size state each sequence carries; the others attend, with
- a sigmoid gate on the attention output, from q_proj's second half of each head;
- QK RMSNorm, and partial RoPE: the first quarter of each head rotates (HF's multi-section RoPE is plain RoPE for
  text, where the three position streams are equal);
- norms that scale by 1 + w (the DeltaNet's gated output norm by w).
HF's modeling_qwen3_5.py and llama.cpp's src/models/qwen35.cpp and delta-net-base.cpp are the references. llama.cpp's
GGUF stores A as -exp(A_log), the norms as w + 1 and a q/k head's value heads tiled rather than grouped (its
converter's _reorder_v_heads): the decoder reads them in that order instead of moving them back."""

from typing import Any

from inferplug.models.family import Family

FULL_ATTENTION_INTERVAL = 4  # HF's default: every fourth layer attends


def _delta_net_fields(recurrent: list[bool], key_heads: int, value_heads: int, key_dim: int, value_dim: int,
                      kernel: int) -> dict[str, Any]:
    return {"linear_layers": tuple(recurrent), "linear_num_key_heads": key_heads,
            "linear_num_value_heads": value_heads, "linear_key_head_dim": key_dim,
            "linear_value_head_dim": value_dim, "linear_conv_kernel_dim": kernel, "attention_output_gate": True}


def hf_fields(raw: dict[str, Any]) -> dict[str, Any]:
    layers = raw["num_hidden_layers"]
    interval = raw.get("full_attention_interval") or FULL_ATTENTION_INTERVAL
    kinds = raw.get("layer_types") or ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                                       for i in range(layers)]
    rope = raw.get("rope_parameters") or {}
    return {**_delta_net_fields([kind == "linear_attention" for kind in kinds], raw["linear_num_key_heads"],
                                raw["linear_num_value_heads"], raw["linear_key_head_dim"],
                                raw["linear_value_head_dim"], raw["linear_conv_kernel_dim"]),
            "rope_scaling": {"rope_type": "partial",
                             "partial_rotary_factor": float(rope.get("partial_rotary_factor", 0.25))}}


def gguf_fields(gguf) -> dict[str, Any]:
    layers = gguf.arch_count("block_count")
    recurrent = gguf.arch_key("attention.recurrent_layers")
    if not isinstance(recurrent, list):
        interval = gguf.arch_count("full_attention_interval", FULL_ATTENTION_INTERVAL)
        recurrent = [(i + 1) % interval != 0 for i in range(layers)]
    value_heads = gguf.arch_count("ssm.time_step_rank")
    rotated = gguf.arch_count("rope.dimension_count")
    return {**_delta_net_fields([bool(r) for r in recurrent], gguf.arch_count("ssm.group_count"), value_heads,
                                gguf.arch_count("ssm.state_size"), gguf.arch_count("ssm.inner_size") // value_heads,
                                gguf.arch_count("ssm.conv_kernel")),
            "linear_heads_tiled": True,
            "rope_scaling": {"rope_type": "partial",
                             "partial_rotary_factor": rotated / gguf.arch_count("attention.key_length")}}


def hf_weights(weights: dict[str, Any], experts: int) -> dict[str, Any]:
    """HF's names as the decoder's: a multimodal checkpoint's language model as the text model (its vision tower
    and multi-token-prediction layers left out), the DeltaNet's A as -exp(A_log) and dt_bias as dt.bias (the GGUF's
    forms)."""
    import torch

    out = {}
    for name, tensor in weights.items():
        name = name.replace("model.language_model.", "model.")
        if name.startswith(("model.visual.", "mtp.")):
            continue
        if name.endswith(".linear_attn.A_log"):
            name, tensor = name.removesuffix("_log"), -torch.exp(tensor.float())
        elif name.endswith(".linear_attn.dt_bias"):
            name = name.removesuffix("_bias") + ".bias"
        out[name] = tensor
    return out


FAMILY = Family(
    name="qwen35",
    hf_model_types=("qwen3_5_text",),
    gguf_architectures=("qwen35",),
    qk_norm=True,
    norms_plus_one=True,
    plain_norms=("linear_attn.norm",),
    gguf_layer_names={"post_attention_norm": "post_attention_layernorm", "attn_qkv": "linear_attn.in_proj_qkv",
                      "attn_gate": "linear_attn.in_proj_z", "ssm_alpha": "linear_attn.in_proj_a",
                      "ssm_beta": "linear_attn.in_proj_b", "ssm_conv1d": "linear_attn.conv1d",
                      "ssm_dt": "linear_attn.dt", "ssm_a": "linear_attn.A", "ssm_norm": "linear_attn.norm",
                      "ssm_out": "linear_attn.out_proj"},
    fused_decode=True,  # decode_layers takes its DeltaNet layers (one delta_net_step_ call each) and output gates
    tensor_parallel_why="its Gated DeltaNet layers' state is not split between ranks yet",
    document_cache_why="three layers in four are Gated DeltaNet, whose state is not position-independent: a "
                       "document's state cannot move to another place in the prompt",
    recurrent_why="its Gated DeltaNet layers keep one state per sequence, which a rejected draft token would have "
                  "to roll back and a beam's fork to copy",
    hf_fields=hf_fields,
    gguf_fields=gguf_fields,
    hf_weights=hf_weights,
)
