"""The Llama-family decoder (Llama 2/3, Mistral, Qwen2, SmolLM) over paged KV pools.

Weights arrive as a HF state dict (HF parameter names); q/k/v and gate/up are fused at load so
a layer runs three big matmuls instead of five small ones. `forward` takes the flat tokens of one
engine step and an AttentionContext; `compute_logits` runs the head only on rows that sample.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from inferplug.kernels import cpu as cpu_kernels
from inferplug.engine.attention import AttentionContext, paged_attention, write_kv
from inferplug.models.config import ModelConfig
from inferplug.quant.block_linear import KERNEL_MAX_ROWS, BlockLinear
from inferplug.quant.checkpoint_layers import fuse_rows  # torch.cat, or an AWQ / GPTQ checkpoint's layers
from inferplug.quant.linear import linear  # F.linear, or a weight-only int8/int4 layer's kernel

BLOCK_KINDS = {"q4_matmul": 4, "q8_matmul": 8}  # BlockLinear.kernel -> decode_layers' weight kind


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
    def __init__(self, config: ModelConfig, state_dict: dict[str, torch.Tensor], *, dtype: torch.dtype, device: str = "cpu"):
        self.config = config
        self.dtype, self.device = dtype, torch.device(device)
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.scale = self.head_dim**-0.5

        def take(name: str) -> torch.Tensor:
            if name not in state_dict:
                raise KeyError(f"weight {name!r} is missing from the checkpoint")
            weight = state_dict[name]
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
            self.layers.append(LayerWeights(
                input_norm=take(f"{p}input_layernorm.weight"),
                qkv=fuse_rows(attn),
                qkv_bias=bias,
                o=take(f"{p}self_attn.o_proj.weight"),
                post_norm=take(f"{p}post_attention_layernorm.weight"),
                gate_up=fuse_rows([take(f"{p}mlp.gate_proj.weight"), take(f"{p}mlp.up_proj.weight")]),
                down=take(f"{p}mlp.down_proj.weight"),
            ))
        self.cos, self.signed_sin = rope_tables(config, self.device)
        # inferplug's own CPU ops (cpu_kernels) where they run: float32 on an AVX2 CPU.
        self.kernels = cpu_kernels.ops() if self.device.type == "cpu" and dtype == torch.float32 else None

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        shape = (self.num_kv_heads, num_blocks, block_size, self.head_dim)  # heads outermost: see engine/attention.py
        return [
            (torch.zeros(shape, dtype=self.dtype, device=self.device), torch.zeros(shape, dtype=self.dtype, device=self.device))
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
        x = F.embedding(input_ids, self.embed)
        blocks = self._block_layers(ctx, x.shape[0])
        if blocks is not None:  # every layer in one C++ call: the same kernels, without Python between them
            group = ctx.decode_groups[0]
            self.kernels.decode_layers(x, *blocks, [k for k, _ in kv_caches], [v for _, v in kv_caches], positions,
                                       self.cos, self.signed_sin, ctx.slot_mapping, group.block_tables, group.lengths,
                                       self.num_heads, self.scale, self.config.rms_norm_eps)
            return x
        rope = None  # the step's cos and sin rows, for the torch path (the kernel reads the tables)
        if self.kernels is None:
            rope = self.cos[positions].to(self.dtype).unsqueeze(1), self.signed_sin[positions].to(self.dtype).unsqueeze(1)
        delta = None  # each residual branch is added inside the next norm: one fused op on the CPU
        rows = ctx.decode_rows
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches):
            h = self.add_rms_norm(x, delta, layer.input_norm)
            qkv = linear(h, layer.qkv, layer.qkv_bias, rows)
            q, k, v = self.rope_and_store(qkv, positions, rope, k_cache, v_cache, ctx.slot_mapping)
            attn = paged_attention(q, k, v, k_cache, v_cache, ctx, self.scale)
            h = self.add_rms_norm(x, linear(attn, layer.o, None, rows), layer.post_norm)
            delta = linear(self.silu_mul(linear(h, layer.gate_up, None, rows)), layer.down, None, rows)
        return x.add_(delta)

    def _block_layers(self, ctx: AttentionContext, tokens: int):
        """(norms, weights, kinds) for cpu_kernels' decode_layers, or None where the step cannot take it: it
        must be decode rows only (prefill rows take float matmuls), on the C++ attention kernel, and every layer
        weight Q4_1 / Q8_0 blocks without bias (no qkv bias either), run by their kernels (at most
        KERNEL_MAX_ROWS rows)."""
        if self.kernels is None or ctx.decode_rows != tokens or len(ctx.decode_groups) != 1 \
                or ctx.decode_groups[0].lengths is None or tokens > KERNEL_MAX_ROWS:
            return None
        norms, weights, kinds = [], [], []
        for layer in self.layers:
            if layer.qkv_bias is not None:  # Qwen2's: the layer-by-layer path adds it
                return None
            norms += [layer.input_norm, layer.post_norm]
            for w in (layer.qkv, layer.o, layer.gate_up, layer.down):
                if not isinstance(w, BlockLinear) or w.kernel not in BLOCK_KINDS or w.bias is not None:
                    return None
                weights.append(w.blocks)
                kinds.append(BLOCK_KINDS[w.kernel])
        return norms, weights, kinds

    def rope_and_store(self, qkv: torch.Tensor, positions: torch.Tensor, rope, k_cache: torch.Tensor,
                       v_cache: torch.Tensor, slots: torch.Tensor):
        """RoPE on the q and k heads of qkv ([T, (heads + 2 kv_heads) * head_dim], in place on the CPU kernel's
        path), K and V stored in the pools at `slots`. Returns q, k, v: [T, heads or kv_heads, head_dim]."""
        if self.kernels is not None:
            self.kernels.rope_write_kv_(qkv, positions, self.cos, self.signed_sin, k_cache, v_cache, slots, self.num_heads)
            return qkv.view(qkv.shape[0], -1, self.head_dim).split([self.num_heads, self.num_kv_heads, self.num_kv_heads], dim=1)
        qkv = qkv.view(qkv.shape[0], -1, self.head_dim)
        qk = apply_rope(qkv[:, : self.num_heads + self.num_kv_heads], *rope)  # q and k heads in one go
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        v = qkv[:, self.num_heads + self.num_kv_heads:]
        write_kv(k_cache, v_cache, k, v, slots)
        return q, k, v

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        if self.kernels is not None:
            return self.kernels.silu_mul(gate_up)
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate).mul_(up)

    def add_rms_norm(self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor) -> torch.Tensor:
        """x += delta in place (when given), then RMSNorm(x); equal to HF's RMSNorm in fp32 (HF rounds to
        the model dtype before the scale in bf16)."""
        eps = self.config.rms_norm_eps
        if self.kernels is not None:
            return self.kernels.rms_norm(x, weight, eps) if delta is None else self.kernels.add_rms_norm_(x, delta, weight, eps)
        if delta is not None:
            x.add_(delta)
        if x.dtype == torch.float32:
            return F.rms_norm(x, weight.shape, weight, eps)
        return F.rms_norm(x.float(), weight.shape, None, eps).to(x.dtype) * weight  # HF's rounding in bf16/fp16

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits for the given rows of hidden states."""
        return linear(self.add_rms_norm(hidden.contiguous(), None, self.norm), self.lm_head).float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE (HF layout: the first and second halves of head_dim pair up).

    `signed_sin` is sin with its first half negated, so HF's rotate_half(x) * sin is x.roll(half) * signed_sin:
    four ops instead of six, each rounding where HF's does (bit-identical in bf16 and fp16 too)."""
    return (x * cos).add_(x.roll(x.shape[-1] // 2, dims=-1).mul_(signed_sin))


def rope_tables(config: ModelConfig, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 cos and signed sin (see apply_rope) for every position up to max_position_embeddings: [positions, head_dim]."""
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
