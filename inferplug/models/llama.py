"""The Llama-family decoder (Llama 2/3, Mistral, Qwen2, SmolLM) over paged KV pools.

Weights arrive as a HF state dict (HF parameter names); q/k/v and gate/up are fused at load so
a layer runs three big matmuls instead of five small ones. `forward` takes the flat tokens of one
engine step and an AttentionContext; `compute_logits` runs the head only on rows that sample.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from inferplug.models.config import ModelConfig
from inferplug.ops import select_ops
from inferplug.ops.attention import AttentionContext
from inferplug.ops.parallel_group import SINGLE, SingleDevice
from inferplug.quant.checkpoint_layers import fold_down_order, fuse_rows  # torch.cat, or an AWQ / GPTQ checkpoint's layers
from inferplug.quant.linear import linear  # F.linear, or a weight-only int8/int4 layer's kernel


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


class LlamaModel:
    def __init__(self, config: ModelConfig, state_dict: dict[str, torch.Tensor], *, dtype: torch.dtype, device: str = "cpu",
                 attention: str = "auto", kv_dtype: torch.dtype | None = None, parallel: SingleDevice = SINGLE):
        """`parallel`: this rank's group under tensor parallelism (engine/parallel): `config` and `state_dict` are
        then the rank's share of the heads and its slices of the weights. The model consumes `state_dict` (each entry
        is popped as it is taken), so a fused projection's parts are freed as it is made: at 7B, holding them to the
        end doubles every q/k/v and gate/up, 2.8 GB."""
        self.config = config
        self.parallel = parallel
        self.dtype, self.device = dtype, torch.device(device)
        self.kv_dtype = kv_dtype or dtype  # the pools' dtype (the plan's kv_dtype)
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.scale = self.head_dim**-0.5

        def take(name: str) -> torch.Tensor:
            if name not in state_dict:
                raise KeyError(f"weight {name!r} is missing from the checkpoint")
            weight = state_dict.pop(name)
            if not isinstance(weight, torch.Tensor):  # an AWQ / GPTQ layer, loaded on its device
                return weight
            return weight.to(device=self.device, dtype=dtype).contiguous()

        self.embed = take("model.embed_tokens.weight")
        self.norm = take("model.norm.weight")
        if config.tie_word_embeddings or "lm_head.weight" not in state_dict:
            self.lm_head = self.embed
        else:
            self.lm_head = take("lm_head.weight")
        self.layers = []
        for i in range(config.num_hidden_layers):
            p = f"model.layers.{i}."
            attn = [take(f"{p}self_attn.{n}_proj.weight") for n in "qkv"]
            bias = None
            if f"{p}self_attn.q_proj.bias" in state_dict:
                bias = torch.cat([take(f"{p}self_attn.{n}_proj.bias") for n in "qkv"])
            gate_up = fuse_rows([take(f"{p}mlp.gate_proj.weight"), take(f"{p}mlp.up_proj.weight")])
            gate_up, down = fold_down_order(gate_up, take(f"{p}mlp.down_proj.weight"))  # GPTQ act-order's, if any
            self.layers.append(LayerWeights(
                input_norm=take(f"{p}input_layernorm.weight"),
                qkv=fuse_rows(attn),
                qkv_bias=bias,
                o=take(f"{p}self_attn.o_proj.weight"),
                post_norm=take(f"{p}post_attention_layernorm.weight"),
                gate_up=gate_up,
                down=down,
            ))
        self.cos, self.signed_sin = rope_tables(config, self.device)
        # The ops interface (ops/): C++ CPU kernels, Triton or torch, chosen here once.
        self.ops = select_ops(attention, self.device, dtype, self.kv_dtype, self.head_dim)

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        shape = (self.num_kv_heads, num_blocks, block_size, self.head_dim)  # heads outermost: see ops/attention.py
        return [
            (torch.zeros(shape, dtype=self.kv_dtype, device=self.device),
             torch.zeros(shape, dtype=self.kv_dtype, device=self.device))
            for _ in self.layers
        ]

    def decode_weight_bytes(self) -> int:
        """Bytes of weights one decode step streams: every layer and the head (the embedding gives one row)."""
        def size(w) -> int:
            return w.nbytes if isinstance(w, torch.Tensor) else w.nbytes()

        layers = sum(size(w) for layer in self.layers for w in vars(layer).values() if w is not None)
        return layers + size(self.lm_head) + self.norm.nbytes

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttentionContext, kv_caches) -> torch.Tensor:
        x = self.parallel.embed(input_ids, self.embed)
        ops, eps, reduce = self.ops, self.config.rms_norm_eps, self.parallel.all_reduce
        # every layer in one kernel call (CPU, block weights); not under tensor parallel, which all-reduces between
        if self.parallel.size == 1 and ops.run_layers(self, x, positions, ctx, kv_caches):
            return x
        delta = None  # each residual branch is added inside the next norm: one fused op
        # the rows that take decode arithmetic (quant/block_linear.py); None: all of them
        rows = ctx.decode_rows + ctx.verify_rows
        for i, (layer, (k_cache, v_cache)) in enumerate(zip(self.layers, kv_caches)):
            h = ops.add_rms_norm(x, delta, layer.input_norm, eps)
            qkv = linear(h, layer.qkv, layer.qkv_bias, rows)
            q, k, v = ops.rope_and_store(qkv, positions, self.cos, self.signed_sin, k_cache, v_cache, ctx, self.num_heads)
            attn = ops.attention(q, k, v, k_cache, v_cache, ctx, self.scale)
            h = ops.add_rms_norm(x, reduce(linear(attn, layer.o, None, rows)), layer.post_norm, eps)
            delta = reduce(linear(ops.silu_mul(linear(h, layer.gate_up, None, rows)), layer.down, None, rows))
            if ctx.probe is not None and i == ctx.probe.layer:  # selective recompute: only the deviating rows go on
                kept, ctx = ctx.probe.narrow(k)
                x, delta, positions = x[kept], delta[kept], positions[kept]
        return x.add_(delta)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits for the given rows of hidden states."""
        logits = linear(self.ops.add_rms_norm(hidden.contiguous(), None, self.norm, self.config.rms_norm_eps),
                        self.lm_head).float()
        return self.parallel.gather_logits(logits, self.config.vocab_size)


def rope_tables(config: ModelConfig, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 cos and signed sin (see ops/torch_ops.apply_rope) for every position up to max_position_embeddings: [positions, head_dim]."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    inv_freq = scale_inv_freq(inv_freq, config.rope_scaling)
    positions = torch.arange(config.max_position_embeddings, dtype=torch.float32)
    freqs = torch.outer(positions, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(device), torch.cat((-freqs.sin(), freqs.sin()), dim=-1).to(device)


def scale_inv_freq(inv_freq: torch.Tensor, scaling: dict | None) -> torch.Tensor:
    """Apply HF rope_scaling: 'linear' and 'llama3'; 'default' or none leaves it alone."""
    kind = (scaling or {}).get("rope_type") or (scaling or {}).get("type") or "default"
    if kind == "default":
        return inv_freq
    factor = float(scaling["factor"])
    if kind == "linear":
        return inv_freq / factor
    if kind == "llama3":
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_len = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return torch.where(medium, smoothed, scaled)
    raise ValueError(f"rope_scaling type {kind!r} is not supported; use a model with default, linear or llama3 RoPE")
