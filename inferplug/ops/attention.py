"""Paged attention in torch ops, and the per-step attention metadata every ops set (ops/) builds. K/V
live in per-layer pools read through block tables.

A pool is [kv_heads, num_blocks, block_size, head_dim]: heads outermost, so the blocks gathered for
a batch are already [kv_heads * batch, tokens, head_dim] and feed batched matmuls without another copy
(a token-major pool cost a full copy of K and V per layer at every decode step).

A step holds decode rows (one new token each) first, then prefill chunks. Everything that
depends only on the step, not the layer (masks, gather indices), is built once in
`AttentionContext` by the model runner.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
class PagedRows:
    """Query rows [start, end) that attend through block tables: decode rows on the torch and Triton paths, every
    row of the step on the C++ kernel's. The torch path groups decode rows of similar context lengths: one gather
    and two batched matmuls, padded to the group's longest (grouping keeps short sequences from reading the
    longest one's width). The C++ kernel (kernels/cpu/paged_attention.cpp) takes every row of the step, prefill
    rows too, in one group, by sequence: it reads K/V in place, each row exactly its own length, so it needs
    neither the gather nor the padding, and each row's arithmetic is the same whatever shares the step (a decode
    row is a one-row prefill chunk)."""

    start: int
    end: int
    block_tables: torch.Tensor  # [rows, blocks], padded with block 0 (C++ kernel: [sequences, blocks])
    bias: torch.Tensor | None  # torch, several rows: [1, rows, 1, S] additive: 0 where attended, -inf past the end
    length: int = 0  # torch, one row: its context length, cut to instead of a bias
    lengths: torch.Tensor | None = None  # context lengths when a kernel runs these rows: [rows] (Triton), [sequences] (C++)
    query_starts: torch.Tensor | None = None  # C++ kernel: [sequences + 1] each sequence's first row, then the end


@dataclass
class PackedPrefill:
    """The prefill rows of a step packed for one kernel call (Triton): sequence i's new tokens are query rows
    [cu_seqlens[i], cu_seqlens[i + 1]) after the decode rows; it attends to its first ctx_lens[i] tokens, read
    through block_tables[i] (the chunk's own K/V is stored in the pool before attention runs)."""

    cu_seqlens: torch.Tensor  # [P + 1] int32, offsets into the prefill rows
    ctx_lens: torch.Tensor  # [P] int32, cached prefix + the chunk
    block_tables: torch.Tensor  # [P, blocks] int32, padded with block 0
    max_q_len: int


@dataclass
class AttentionContext:
    slot_mapping: torch.Tensor  # [T] flat slot (block * block_size + offset) of each new token
    decode_rows: int = 0  # the first rows are decode tokens, the rest prefill (quant/block_linear.py rounds them apart)
    verify_rows: int = 0  # the next rows check speculated tokens: decode arithmetic in the linears (block_linear)
    paged_rows: list[PagedRows] = field(default_factory=list)  # torch, Triton: the decode rows; C++ kernel: every row
    prefills: list[PrefillChunk] = field(default_factory=list)  # torch path: one per prefill sequence
    packed_prefill: PackedPrefill | None = None  # Triton path: every prefill row in one call
    # torch path: the step's cos and sin rows, made once per table (a sliding layer may have its own base)
    rope_rows: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    probe: Any = None  # engine/rag_recompute.DeviationProbe: rows that stop after an early layer
    # a hybrid model's DeltaNet layers (models/delta_net.py): each sequence's (rows, state slot, fresh), in row order
    states: list[tuple[int, int, bool]] = field(default_factory=list)
    window: AttentionContext | None = None  # the sliding-window layers', where they keep their own pools


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
    """Store K/V rows ([T, kv_heads, head_dim]) into the pools at their flat slots (block * block_size + offset)."""
    for cache, rows in ((k_cache, k), (v_cache, v)):  # a pool in another dtype (kv_dtype) stores a plain cast
        cache.view(cache.shape[0], -1, cache.shape[-1]).index_copy_(1, slots, rows.transpose(0, 1).to(cache.dtype))


def read_kv(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """The rows at `slots` of one pool: [len(slots), kv_heads, head_dim]."""
    return cache.view(cache.shape[0], -1, cache.shape[-1]).index_select(1, slots).transpose(0, 1)


def _gather(cache: torch.Tensor, block_ids: torch.Tensor, rows: int) -> torch.Tensor:
    """Blocks `block_ids` (rows x blocks each, flattened) of a pool as [kv_heads * rows, tokens, head_dim]."""
    kv_heads, head_dim = cache.shape[0], cache.shape[-1]
    return cache.index_select(1, block_ids).view(kv_heads * rows, -1, head_dim)


def paged_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    ctx: AttentionContext, scale: float, window: int = 0, sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """q: [T, heads, D]; k, v: [T, kv_heads, D], already stored in the pools (write_kv). Returns [T, heads * D].
    `window`: each query attends only to the last `window` positions up to its own (0: all of them). `sinks`:
    [heads] fp32 logits, one more term in each query's softmax denominator (gpt-oss)."""
    if not ctx.prefills and len(ctx.paged_rows) == 1:  # the common step: no scatter into `out`
        return _decode(q, k_cache, v_cache, ctx.paged_rows[0], scale, window, sinks).flatten(1)
    out = torch.empty_like(q)
    for group in ctx.paged_rows:
        out[group.start : group.end] = _decode(q[group.start : group.end], k_cache, v_cache, group, scale, window,
                                               sinks)
    for chunk in ctx.prefills:
        rows = slice(chunk.q_start, chunk.q_start + chunk.q_len)
        out[rows] = _prefill(q[rows], k[rows], v[rows], k_cache, v_cache, chunk, scale, window, sinks)
    return out.flatten(1)


def _window_bias(rows: PagedRows, width: int, window: int, dtype: torch.dtype) -> torch.Tensor:
    """The decode group's bias with the keys before each row's window masked too: [1, rows, 1, S]."""
    keys = torch.arange(width, device=rows.bias.device)
    before = keys[None, :] < (rows.lengths - window)[:, None]
    return rows.bias.masked_fill(before[None, :, None, :], float("-inf")).to(dtype)


def _decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, rows: PagedRows, scale: float,
            window: int = 0, sinks: torch.Tensor | None = None):
    """One query per sequence: batched matmuls over (kv head, sequence), no repeat_interleave of K/V."""
    batch, heads, head_dim = q.shape
    kv_heads = k_cache.shape[0]
    group = heads // kv_heads
    tables = rows.block_tables.view(-1)
    keys, values = _gather(k_cache, tables, batch), _gather(v_cache, tables, batch)  # [kv_heads * B, S, D]
    if rows.bias is None:  # one sequence: cut at its length (and its window) instead of masking
        first = max(0, rows.length - window) if window else 0
        keys, values = keys[:, first : rows.length], values[:, first : rows.length]
    # bf16/fp16 (opt-in) score, softmax and sum in fp32, as SDPA's CPU kernels do (no-ops in fp32)
    keys, values = keys.float(), values.float()
    q32 = q.float().view(batch, kv_heads, group, head_dim).transpose(0, 1).reshape(kv_heads * batch, group, head_dim)
    scores = torch.bmm(q32, keys.transpose(1, 2)).mul_(scale)  # [kv_heads * B, group, S]
    if rows.bias is not None:
        bias = _window_bias(rows, keys.shape[1], window, rows.bias.dtype) if window else rows.bias
        scores.view(kv_heads, batch, group, -1).add_(bias)
    if sinks is not None:  # a last column of each head's sink logit, in the softmax, then dropped
        sink = sinks.view(kv_heads, 1, group, 1).expand(kv_heads, batch, group, 1).reshape(kv_heads * batch, group, 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    out = torch.bmm(probs, values).view(kv_heads, batch, group, head_dim)
    return out.transpose(0, 1).reshape(batch, heads, head_dim).to(q.dtype)


def _prefill(q, k, v, k_cache, v_cache, chunk: PrefillChunk, scale: float, window: int = 0,
             sinks: torch.Tensor | None = None) -> torch.Tensor:
    mask = chunk.mask
    if window and chunk.ctx_len > window:  # keys before a query's window are masked too
        query_pos = torch.arange(chunk.ctx_len - chunk.q_len, chunk.ctx_len, device=q.device)[:, None]
        keys = torch.arange(chunk.ctx_len, device=q.device)[None, :]
        mask = (keys <= query_pos) & (keys > query_pos - window)
    if chunk.block_ids is not None:  # part of the context is cached: read it all back through the table
        k = _gather(k_cache, chunk.block_ids, 1)[:, : chunk.ctx_len].to(q.dtype)  # [kv_heads, ctx_len, D]
        v = _gather(v_cache, chunk.block_ids, 1)[:, : chunk.ctx_len].to(q.dtype)
    else:
        k, v = k.transpose(0, 1), v.transpose(0, 1)
    if sinks is not None:
        k, v, mask = _with_sink_key(k, v, mask, sinks, chunk)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k, v,
        attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=True,
    )
    return out.transpose(0, 1)


def _with_sink_key(k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, sinks: torch.Tensor,
                   chunk: PrefillChunk) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention sinks through SDPA: one more key and value of zeros, whose score (q . 0 plus the float mask's last
    column) is each head's sink logit, and whose value adds nothing."""
    kv_heads, _, head_dim = k.shape
    if mask is None:
        query_pos = torch.arange(chunk.ctx_len - chunk.q_len, chunk.ctx_len, device=k.device)[:, None]
        mask = torch.arange(chunk.ctx_len, device=k.device)[None, :] <= query_pos
    zero = k.new_zeros(kv_heads, 1, head_dim)
    bias = torch.zeros(mask.shape, dtype=k.dtype, device=k.device).masked_fill_(~mask, float("-inf"))
    sink = sinks.to(k.dtype)[:, None, None].expand(-1, chunk.q_len, 1)
    return torch.cat([k, zero], dim=1), torch.cat([v, zero], dim=1), torch.cat([bias.expand(len(sinks), -1, -1), sink], 2)
