"""Paged attention on the CPU (torch). K/V live in per-layer pools read through block tables.

A step holds decode rows (one new token each) first, then prefill chunks. Everything that
depends only on the step, not the layer (masks, gather indices), is built once in
`AttentionContext` by the model runner.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class PrefillChunk:
    """New tokens [q_start, q_start + q_len) of one sequence that already has ctx_len - q_len cached."""

    q_start: int
    q_len: int
    ctx_len: int
    block_ids: torch.Tensor | None  # blocks covering ctx_len; None when nothing was cached before
    mask: torch.Tensor | None  # [q_len, ctx_len] bool, True = attend; None = plain causal


@dataclass
class AttentionContext:
    slot_mapping: torch.Tensor  # [T] flat slot (block * block_size + offset) of each new token
    num_decode: int = 0
    decode_block_tables: torch.Tensor | None = None  # [B, max_blocks]
    decode_bias: torch.Tensor | None = None  # [B, 1, 1, S] additive: 0 where attended, -inf past the end
    prefills: list[PrefillChunk] = field(default_factory=list)


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
    """Store the step's new K/V ([T, kv_heads, head_dim]) into the pools at their slots."""
    kv_heads, head_dim = k.shape[1], k.shape[2]
    k_cache.view(-1, kv_heads, head_dim).index_copy_(0, slots, k)
    v_cache.view(-1, kv_heads, head_dim).index_copy_(0, slots, v)


def paged_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    ctx: AttentionContext, scale: float,
) -> torch.Tensor:
    """q: [T, heads, D]; k, v: [T, kv_heads, D] (already written to the pools). Returns [T, heads * D]."""
    write_kv(k_cache, v_cache, k, v, ctx.slot_mapping)
    out = torch.empty_like(q)
    if ctx.num_decode:
        out[: ctx.num_decode] = _decode(q[: ctx.num_decode], k_cache, v_cache, ctx, scale)
    for chunk in ctx.prefills:
        rows = slice(chunk.q_start, chunk.q_start + chunk.q_len)
        out[rows] = _prefill(q[rows], k[rows], v[rows], k_cache, v_cache, chunk, scale)
    return out.flatten(1)


def _decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, ctx: AttentionContext, scale: float):
    """One query per sequence: a batched matmul per KV-head group, no repeat_interleave of K/V."""
    batch, heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    tables = ctx.decode_block_tables
    keys = k_cache[tables].flatten(1, 2).permute(0, 2, 3, 1)  # [B, kv_heads, D, S]
    values = v_cache[tables].flatten(1, 2).transpose(1, 2)  # [B, kv_heads, S, D]
    q = q.view(batch, kv_heads, heads // kv_heads, head_dim)
    scores = torch.matmul(q, keys).mul_(scale).add_(ctx.decode_bias)  # [B, kv_heads, group, S]
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, values).view(batch, heads, head_dim)


def _prefill(q, k, v, k_cache, v_cache, chunk: PrefillChunk, scale: float) -> torch.Tensor:
    if chunk.block_ids is not None:  # part of the context is cached: read it all back through the table
        kv_heads, head_dim = k.shape[1], k.shape[2]
        k = k_cache[chunk.block_ids].view(-1, kv_heads, head_dim)[: chunk.ctx_len]
        v = v_cache[chunk.block_ids].view(-1, kv_heads, head_dim)[: chunk.ctx_len]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
        attn_mask=chunk.mask, is_causal=chunk.mask is None, scale=scale, enable_gqa=True,
    )
    return out.transpose(0, 1)
