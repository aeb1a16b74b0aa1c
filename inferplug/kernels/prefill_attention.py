"""Triton paged prefill and chunked-prefill attention (flash-style online softmax) on CUDA.

Sequences are packed along the rows with cu_seqlens. Each sequence's new tokens are stored in the pool first
(layer_ops.store_kv), so a chunk reads its cached prefix and itself alike, through its block table: a prefix
hit, a chunked prompt and a fresh prompt are one code path. Specification: prefill_attention_ref.py.

One program per (query tile, sequence, query head): BLOCK_M query rows against BLOCK_N-token key tiles gathered
across pool blocks, scores and P @ V as tl.dot with fp32 accumulation, keys past the tile's last position
skipped (causal), the diagonal tile masked. The key loop's order and tile size are fixed, so a row's result does
not depend on what else is packed with it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from inferplug.kernels.attention_tile import LOG2E, attend_tile, pool_geometry, sink_logits, sink_normalizer

BLOCK_M, BLOCK_N = 64, 64
NUM_WARPS, NUM_STAGES = 4, 2


@triton.jit
def _prefill_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, cu_ptr, ctx_lens_ptr, tables_ptr, sinks_ptr, qk_scale, window,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_cb, stride_cs, stride_ch, stride_tb,
    GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, HAS_SINKS: tl.constexpr,
):  # fmt: skip
    tile, seq, head = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    first = tl.load(cu_ptr + seq)
    q_len = tl.load(cu_ptr + seq + 1) - first
    if tile * BLOCK_M >= q_len:  # the grid covers the longest chunk; this one is shorter
        return
    ctx_len = tl.load(ctx_lens_ptr + seq)
    prefix = ctx_len - q_len

    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < q_len
    positions = prefix + rows  # each query's position in its sequence
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM
    q_mask = row_ok[:, None] & dim_ok[None, :]
    q_rows = (first + rows).to(tl.int64)
    q = tl.load(q_ptr + q_rows[:, None] * stride_qt + head * stride_qh + dims[None, :], mask=q_mask, other=0.0)
    kv_base = (head // GROUP).to(tl.int64) * stride_ch
    table = tables_ptr + seq.to(tl.int64) * stride_tb
    slots = tl.arange(0, BLOCK_N)

    running_max = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    running_sum = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    end = tl.minimum(ctx_len, prefix + (tile + 1) * BLOCK_M)  # the tile's last query sees no further
    # a sliding window: keys from the tile's first query's window on, in key tiles at absolute positions
    lowest = tl.where(window > 0, tl.maximum(prefix + tile * BLOCK_M - window + 1, 0), 0)
    for key_start in range(lowest // BLOCK_N * BLOCK_N, end, BLOCK_N):
        keys = key_start + slots
        key_ok = keys < end
        visible = key_ok[None, :] & (keys[None, :] <= positions[:, None])  # causal
        visible = visible & ((window == 0) | (keys[None, :] > positions[:, None] - window))
        running_max, running_sum, acc = attend_tile(
            q, k_ptr, v_ptr, table, kv_base, keys, key_ok, visible, dims, dim_ok, stride_cb, stride_cs, qk_scale,
            running_max, running_sum, acc, BLOCK_SIZE, PRECISION,
        )  # fmt: skip

    if HAS_SINKS:  # rows past the chunk see keys too (their positions run on): their max and sum are finite
        out = acc * sink_normalizer(running_max, running_sum, tl.load(sinks_ptr + head))[:, None]
    else:
        out = acc / tl.where(row_ok, running_sum, 1.0)[:, None]
    o_rows = (first + rows).to(tl.int64)
    tl.store(out_ptr + o_rows[:, None] * stride_ot + head * stride_oh + dims[None, :],
             out.to(out_ptr.dtype.element_ty), mask=q_mask)  # fmt: skip


def prefill_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cu_seqlens: torch.Tensor, ctx_lens: torch.Tensor,
    block_tables: torch.Tensor, scale: float, *, window: int = 0, sinks: torch.Tensor | None = None,
    max_q_len: int | None = None, block_m: int = BLOCK_M,
    block_n: int = BLOCK_N, num_warps: int = NUM_WARPS, num_stages: int = NUM_STAGES,
) -> torch.Tensor:  # fmt: skip
    """prefill_attention_ref's contract: q [T, heads, D] (unit stride over D) -> [T, heads, D]; `window` > 0: each
    query reads only the last `window` positions up to its own (a sliding-window layer); `sinks` [heads]:
    attention-sink logits.

    max_q_len (the longest chunk) sizes the grid without reading cu_seqlens on the host; block_m, block_n,
    num_warps and num_stages are tuning knobs (the benchmark sweeps them)."""
    tokens, heads, head_dim = q.shape
    kv_heads, block_size = pool_geometry(heads, k_cache)
    if q.stride(2) != 1 or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("prefill_attention needs unit-stride query rows and contiguous pools")
    out = torch.empty((tokens, heads, head_dim), dtype=q.dtype, device=q.device)
    num_seqs = len(ctx_lens)
    if max_q_len is None:
        max_q_len = int((cu_seqlens[1:] - cu_seqlens[:-1]).max()) if num_seqs else 0
    if not tokens or not num_seqs:
        return out
    _prefill_kernel[(triton.cdiv(max_q_len, block_m), num_seqs, heads)](
        q, k_cache, v_cache, out, cu_seqlens, ctx_lens, block_tables, sink_logits(sinks, q), scale * LOG2E, window,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(1), k_cache.stride(2), k_cache.stride(0), block_tables.stride(0),
        GROUP=heads // kv_heads, BLOCK_SIZE=block_size, HEAD_DIM=head_dim,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)), BLOCK_M=block_m, BLOCK_N=block_n,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", HAS_SINKS=sinks is not None,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return out
