"""Qwen3-MoE (30B-A3B, 235B-A22B): Qwen3's attention, and a mixture-of-experts MLP in every layer.

The router is a softmax over all experts, its top k kept and (norm_topk_prob) renormalized to sum to 1; each
expert is a SwiGLU MLP of moe_intermediate_size (models/moe.py)."""

from typing import Any

from inferplug.models.family import Family


def hf_fields(raw: dict[str, Any]) -> dict[str, Any]:
    sparse_step, dense = raw.get("decoder_sparse_step", 1), set(raw.get("mlp_only_layers") or ())
    layers = raw["num_hidden_layers"]
    experts = raw.get("num_experts") or raw["num_local_experts"]  # transformers 5 writes the latter
    return {"num_experts": experts, "num_experts_per_tok": raw["num_experts_per_tok"],
            "moe_intermediate_size": raw["moe_intermediate_size"],
            "norm_topk_prob": bool(raw.get("norm_topk_prob", False)),
            "moe_layers": tuple(i not in dense and (i + 1) % sparse_step == 0 for i in range(layers))}


def gguf_fields(gguf) -> dict[str, Any]:
    layers = gguf.arch_count("block_count")
    return {"num_experts": gguf.arch_count("expert_count"), "num_experts_per_tok": gguf.arch_count("expert_used_count"),
            "moe_intermediate_size": gguf.arch_count("expert_feed_forward_length"),
            "norm_topk_prob": bool(gguf.arch_key("expert_weights_norm", True)),  # llama.cpp's qwen3moe always does
            "moe_layers": tuple([True] * layers)}


FAMILY = Family(
    name="qwen3_moe",
    hf_model_types=("qwen3_moe",),
    gguf_architectures=("qwen3moe",),
    qk_norm=True,
    fused_decode=True,  # decode_layers takes its router and experts (one moe_experts call a layer)
    hf_fields=hf_fields,
    gguf_fields=gguf_fields,
)
