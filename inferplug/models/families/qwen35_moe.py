"""Qwen3.5 / 3.6 MoE (35B-A3B, 122B-A10B, 397B-A17B): Qwen3.5's hybrid stack (families/qwen35.py) with a
mixture-of-experts MLP in every layer: the router's top k of its experts, renormalized (models/moe.py), plus a shared
expert, a SwiGLU MLP every row runs, scaled by sigmoid(shared_expert_gate . x). HF's modeling_qwen3_5_moe.py and
llama.cpp's src/models/qwen35moe.cpp are the references."""

import dataclasses
from typing import Any

from inferplug.models.families import qwen35


def _moe_fields(layers: int, experts: int, top_k: int, inter: int, shared: int) -> dict[str, Any]:
    return {"num_experts": experts, "num_experts_per_tok": top_k, "moe_intermediate_size": inter,
            "norm_topk_prob": True, "moe_layers": tuple([True] * layers), "shared_expert_intermediate_size": shared}


def hf_fields(raw: dict[str, Any]) -> dict[str, Any]:
    return {**qwen35.hf_fields(raw),
            **_moe_fields(raw["num_hidden_layers"], raw["num_experts"], raw["num_experts_per_tok"],
                          raw["moe_intermediate_size"], raw["shared_expert_intermediate_size"])}


def gguf_fields(gguf) -> dict[str, Any]:
    return {**qwen35.gguf_fields(gguf),
            **_moe_fields(gguf.arch_count("block_count"), gguf.arch_count("expert_count"),
                          gguf.arch_count("expert_used_count"), gguf.arch_count("expert_feed_forward_length"),
                          gguf.arch_count("expert_shared_feed_forward_length"))}


FAMILY = dataclasses.replace(
    qwen35.FAMILY,  # its decoder, with these differences
    name="qwen35moe",
    hf_model_types=("qwen3_5_moe_text",),
    gguf_architectures=("qwen35moe",),
    gguf_layer_names={**qwen35.FAMILY.gguf_layer_names, "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
                      "ffn_gate_shexp": "mlp.shared_expert.gate_proj", "ffn_up_shexp": "mlp.shared_expert.up_proj",
                      "ffn_down_shexp": "mlp.shared_expert.down_proj"},
    hf_fields=hf_fields,
    gguf_fields=gguf_fields,
)
