"""Random weights at a model's geometry, in the format the profile runs: vLLM's `--load-format dummy`, so that
benchmarks and memory tests run a 7B model without its download ([model] load_format = "dummy").

Each weight is made as its format stores it and goes through the same layer constructors as a real file:
- "gguf": a Q4_K_M file's types (models/gguf_random.q4_k_m_type) as random blocks, converted as loaded ones are;
- "awq" / "gptq": random 4-bit groups of 128 (GPTQ with act-order's shuffled groups), through checkpoint_layer;
- "int4" / "int8": random Q4_1 / Q8_0 blocks; the embedding and the head float, as a float model's (quantize_model
  then gives the head its format);
- anything else: random float weights in the engine dtype.
Matrices have spread 1 / sqrt(inputs) so activations stay near unit size; norms are ones.
"""

from __future__ import annotations

import zlib
from typing import Any

import torch

from inferplug.models.config import ModelConfig
from inferplug.models.gguf_random import q4_k_m_type, random_blocks

GROUP_SIZE = 128


def dummy_weights(config: ModelConfig, fmt: str, dtype: torch.dtype, device: str, layers_on_kernels: bool,
                  seed: int = 0) -> dict[str, Any]:
    """HF-named random weights; `layers_on_kernels`: the CPU kernels run (block layers can be built)."""
    from inferplug.models.registry import family

    fam = family(config.family)
    # a norm that scales by 1 + w (Gemma's, as HF stores it) is zeros for a scale of one
    norm = (torch.zeros if fam.norms_plus_one else torch.ones)
    generator = torch.Generator().manual_seed(seed)
    weights: dict[str, Any] = {"model.norm.weight": norm(config.hidden_size, dtype=dtype, device=device)}
    for name, (rows, cols) in _matrices(config):
        weights[name] = _matrix(name, rows, cols, config, fmt, dtype, device, layers_on_kernels, generator)
    ones = lambda name, size: weights.__setitem__(name, norm(size, dtype=dtype, device=device))  # noqa: E731
    if config.per_layer_input_size:  # Gemma 4's per-layer inputs
        ones("model.per_layer_projection_norm.weight", config.per_layer_input_size)
    for i in range(config.num_hidden_layers):
        names = ["input_layernorm", "post_attention_layernorm"]
        names += ["pre_feedforward_layernorm", "post_feedforward_layernorm"] if fam.sandwich_norms else []
        names += ["post_per_layer_input_norm"] if config.per_layer_input_size else []
        names += ["pre_feedforward_layernorm_2", "post_feedforward_layernorm_1", "post_feedforward_layernorm_2"] \
            if config.dense_beside_moe and config.is_moe_layer(i) else []
        for name in names:
            ones(f"model.layers.{i}.{name}.weight", config.hidden_size)
        for name in ("q_norm", "k_norm")[: 2 if config.kv_source(i) == i else 1] \
                if fam.qk_norm and not config.is_linear_layer(i) else ():
            ones(f"model.layers.{i}.self_attn.{name}.weight", config.head_dim_of(i))
        if config.is_linear_layer(i):  # a DeltaNet's conv (random), dt bias, decay rate and plain output norm
            p, heads, channels = f"model.layers.{i}.linear_attn.", config.linear_num_value_heads, \
                config.delta_net_sizes()[2]
            weights[f"{p}conv1d.weight"] = (torch.randn(channels, 1, config.linear_conv_kernel_dim, generator=generator)
                                            * 0.5).to(device=device, dtype=dtype)
            weights[f"{p}dt.bias"] = torch.zeros(heads, dtype=dtype, device=device)
            weights[f"{p}A"] = -torch.ones(heads, dtype=dtype, device=device)
            weights[f"{p}norm.weight"] = torch.ones(config.linear_value_head_dim, dtype=dtype, device=device)
        if fam.name == "gemma4":  # its output scale, and in an MoE layer the router's input and experts' scales
            ones(f"model.layers.{i}.layer_scalar.weight", 1)
        if config.dense_beside_moe and config.is_moe_layer(i):
            ones(f"model.layers.{i}.mlp.gate.scale", config.hidden_size)
            for e in range(config.num_experts):
                ones(f"model.layers.{i}.mlp.experts.{e}.down_proj.scale", 1)
        for module, (rows, _) in config.layer_matrices(i).items() if fam.all_biases else ():  # zeros: no effect
            weights[f"model.layers.{i}.{module}.bias"] = torch.zeros(rows, dtype=dtype, device=device)
        if fam.attention_sinks:  # logits of minus infinity: no effect either
            weights[f"model.layers.{i}.self_attn.sinks"] = torch.full((config.num_attention_heads,), float("-inf"),
                                                                       dtype=dtype, device=device)
    return weights


def _matrices(config: ModelConfig):
    yield "model.embed_tokens.weight", (config.vocab_size, config.hidden_size)
    if config.per_layer_input_size:  # Gemma 4's: a table and a projection of the embedding, per layer side by side
        width = config.num_hidden_layers * config.per_layer_input_size
        yield "model.embed_tokens_per_layer.weight", (config.vocab_size, width)
        yield "model.per_layer_model_projection.weight", (width, config.hidden_size)
    if not config.tie_word_embeddings:
        yield "lm_head.weight", (config.vocab_size, config.hidden_size)
    for i in range(config.num_hidden_layers):
        for module, shape in config.layer_matrices(i).items():
            yield f"model.layers.{i}.{module}.weight", shape


def _matrix(name: str, rows: int, cols: int, config: ModelConfig, fmt: str, dtype, device, on_kernels: bool,
            generator: torch.Generator):
    from inferplug.models.gguf_convert import gguf_name
    from inferplug.models.gguf_layers import gguf_layer
    from inferplug.models.registry import family

    std = cols**-0.5
    if name.endswith((".mlp.gate.weight", ".mlp.shared_expert_gate.weight")):  # an MoE's routers: float, as files keep them
        return (torch.randn(rows, cols, generator=generator) * std).to(device=device, dtype=dtype)
    outer = name in ("model.embed_tokens.weight", "model.embed_tokens_per_layer.weight", "lm_head.weight")
    head = name == "lm_head.weight" or (outer and config.tie_word_embeddings)
    if fmt == "gguf" and on_kernels:
        type_name = q4_k_m_type(gguf_name(name, family(config.family)), _layer(name, config), config.num_hidden_layers)
        return gguf_layer(random_blocks(type_name, (rows, cols), std, generator), type_name, (rows, cols), "gguf", head)
    if fmt in ("int4", "int8") and on_kernels and not outer:
        type_name = {"int4": "Q4_1", "int8": "Q8_0"}[fmt]
        return gguf_layer(random_blocks(type_name, (rows, cols), std, generator), type_name, (rows, cols), fmt)
    if fmt in ("awq", "gptq") and not outer:
        from inferplug.quant.checkpoint_layers import checkpoint_layer

        return checkpoint_layer(_random_groups(rows, cols, std, fmt == "gptq", name, generator), device)
    return (torch.randn(rows, cols, generator=generator) * std).to(device=device, dtype=dtype)


def _random_groups(rows: int, cols: int, std: float, act_order: bool, name: str, generator: torch.Generator):
    """4-bit groups whose values (q - z) * s have about spread `std` (uniform codes: spread 4.6 steps). Act-order
    shuffles the groups' inputs alike for the projections that share an input (q/k/v, gate/up), as GPTQ does."""
    from inferplug.quant.group_int4 import GroupQuant

    groups = cols // GROUP_SIZE
    g_idx = torch.arange(cols) // GROUP_SIZE
    if act_order:
        _, _, layer, module = name.removesuffix(".weight").split(".", 3)  # model.layers.<i>.<module>.weight
        shared_input = f"{layer}.{ModelConfig.shared_input(module)}"
        order_seed = torch.Generator().manual_seed(zlib.crc32(shared_input.encode()))
        g_idx = g_idx[torch.randperm(cols, generator=order_seed)]
    nibbles = torch.randint(0, 256, (rows, cols // 32, 16), dtype=torch.uint8, generator=generator)  # GroupQuant.packed
    return GroupQuant(packed=nibbles,
                      scales=torch.full((rows, groups), std / 4.6, dtype=torch.float16),
                      zeros=torch.full((rows, groups), 8, dtype=torch.int16), g_idx=g_idx)


def _layer(name: str, config: ModelConfig) -> int:
    return int(name.split(".")[2]) if name.startswith("model.layers.") else config.num_hidden_layers - 1
