"""Triton paged-attention decode: one query per sequence, K/V read through block tables.

Pool layout as the engine allocates it (inferplug/models/decoder.py allocate_kv_cache):
[kv_heads, num_blocks, block_size, head_dim]. Reference: inferplug/kernels/paged_attention_ref.py. Tests run it under
TRITON_INTERPRET=1 on the CPU.

Design (flash-decoding over a paged pool):
- One program per (partition, sequence, KV head) serves all GROUP = heads // kv_heads query heads of that KV
  head as one [GROUP_PAD, D] tile, so K/V are read from HBM once per KV head, and scores and P @ V are tl.dot
  products (GROUP and D padded to >= 16, the tensor-core minimum; pad rows are masked) with fp32 accumulation.
- Each loop iteration gathers TILE tokens across several pool blocks: token t lives in block
  table[t // block_size] at slot t % block_size, so a 64-token tile is four 4 KiB blocks at 7B geometry.
- Split-K: a sequence longer than one partition (PARTITION_SIZE tokens) is cut into partitions that run as
  separate programs, each writing its partial (max, sum, unnormalised acc); a second kernel merges them in
  partition order. A sequence of one partition is written directly. The partition size is a constant, and
  whether a sequence splits depends only on its own length, never on the batch, so a sequence's output is the
  same bits alone or in any batch (DESIGN.md: batch-invariant ops).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from inferplug.kernels.attention_tile import LOG2E, attend_tile, pool_geometry, sink_logits, sink_normalizer

# Tokens per split-K partition. 256 at 7B geometry: batch 1 with a 4k context gives 8 KV heads x 16 partitions
# = 128 programs, about one per SM on an H200 (132), while the partials (GROUP x (D + 2) fp32 per partition and
# KV head) are under 2% of the partition's K/V bytes, so large batches lose little by splitting too.
PARTITION_SIZE = 256
TILE = 64  # tokens per loop iteration: K and V tiles of 16 KiB each at head_dim 128 in bf16
NUM_WARPS, NUM_STAGES = 4, 3
_REDUCE_CHUNK = 16  # partitions merged per iteration of the reduction kernel


@triton.jit
def _paged_decode_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, m_ptr, l_ptr, acc_ptr, tables_ptr, lens_ptr, sinks_ptr, qk_scale, partition,
    max_parts, window, stride_qb, stride_qh, stride_cb, stride_cs, stride_ch, stride_tb, stride_ob, stride_oh,
    HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, TILE: tl.constexpr, PRECISION: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):  # fmt: skip
    part, seq, kv_head = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    length = tl.load(lens_ptr + seq)
    start = part * partition
    if start >= length:  # the grid covers the table's capacity; this sequence is shorter
        return
    end = tl.minimum(start + partition, length)
    # a sliding window reads only the last `window` keys: a partition before it holds nothing (max -inf, sum 0)
    first = tl.maximum(start, tl.where(window > 0, length - window, 0))

    rows = tl.arange(0, GROUP_PAD)
    row_ok = rows < GROUP
    heads = kv_head * GROUP + rows
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM
    q_mask = row_ok[:, None] & dim_ok[None, :]
    q = tl.load(q_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :], mask=q_mask, other=0.0)
    kv_base = kv_head.to(tl.int64) * stride_ch
    table = tables_ptr + seq.to(tl.int64) * stride_tb
    slots = tl.arange(0, TILE)

    running_max = tl.full((GROUP_PAD,), float("-inf"), tl.float32)
    running_sum = tl.zeros((GROUP_PAD,), tl.float32)
    acc = tl.zeros((GROUP_PAD, BLOCK_D), tl.float32)
    for tile_start in range(first, end, TILE):
        tokens = tile_start + slots
        valid = tokens < end
        running_max, running_sum, acc = attend_tile(
            q, k_ptr, v_ptr, table, kv_base, tokens, valid, valid[None, :], dims, dim_ok, stride_cb, stride_cs,
            qk_scale, running_max, running_sum, acc, BLOCK_SIZE, PRECISION,
        )  # fmt: skip

    if length <= partition:  # one partition: the final output, no reduction pass
        if HAS_SINKS:
            sink = tl.load(sinks_ptr + heads, mask=row_ok, other=0.0)
            out = acc * sink_normalizer(running_max, running_sum, sink)[:, None]
        else:
            out = acc / running_sum[:, None]
        out_offsets = seq * stride_ob + heads[:, None] * stride_oh + dims[None, :]
        tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=q_mask)
    else:
        partial = (seq * HEADS + heads).to(tl.int64) * max_parts + part  # [GROUP_PAD]: row of each head's partial
        tl.store(m_ptr + partial, running_max, mask=row_ok)
        tl.store(l_ptr + partial, running_sum, mask=row_ok)
        tl.store(acc_ptr + partial[:, None] * HEAD_DIM + dims[None, :], acc, mask=q_mask)


@triton.jit
def _reduce_partitions_kernel(
    out_ptr, m_ptr, l_ptr, acc_ptr, lens_ptr, sinks_ptr, partition, max_parts, stride_ob, stride_oh,
    HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CHUNK: tl.constexpr, HAS_SINKS: tl.constexpr,
):  # fmt: skip
    seq, head = tl.program_id(0), tl.program_id(1)
    num_parts = tl.cdiv(tl.load(lens_ptr + seq), partition)
    if num_parts <= 1:  # written by the first kernel
        return
    base = (seq * HEADS + head).to(tl.int64) * max_parts
    chunk = tl.arange(0, CHUNK)
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM

    # Two passes in partition order, a fixed reduction order: the global max, then the rescaled sums.
    global_max = tl.full((), float("-inf"), tl.float32)
    for first in range(0, num_parts, CHUNK):
        parts = first + chunk
        maxes = tl.load(m_ptr + base + parts, mask=parts < num_parts, other=float("-inf"))
        global_max = tl.maximum(global_max, tl.max(maxes, axis=0))
    total = tl.zeros((), tl.float32)
    acc = tl.zeros((BLOCK_D,), tl.float32)
    for first in range(0, num_parts, CHUNK):
        parts = first + chunk
        ok = parts < num_parts
        weights = tl.exp2(tl.load(m_ptr + base + parts, mask=ok, other=float("-inf")) - global_max)
        total += tl.sum(weights * tl.load(l_ptr + base + parts, mask=ok, other=0.0), axis=0)
        partial = tl.load(acc_ptr + (base + parts)[:, None] * HEAD_DIM + dims[None, :],
                          mask=ok[:, None] & dim_ok[None, :], other=0.0)  # fmt: skip
        acc += tl.sum(weights[:, None] * partial, axis=0)
    if HAS_SINKS:  # the sink's term in the denominator
        out = acc * sink_normalizer(global_max, total, tl.load(sinks_ptr + head))
    else:
        out = acc / total
    tl.store(out_ptr + seq * stride_ob + head * stride_oh + dims, out.to(out_ptr.dtype.element_ty), mask=dim_ok)


def paged_attention_decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float, *, window: int = 0,
    sinks: torch.Tensor | None = None, split_k: bool = True,
    partition_size: int = PARTITION_SIZE, tile: int = TILE, num_warps: int = NUM_WARPS, num_stages: int = NUM_STAGES,
) -> torch.Tensor:  # fmt: skip
    """Same contract as paged_attention_decode_ref: q [B, heads, D] -> [B, heads, D]; `window` > 0: each query
    reads only its sequence's last `window` keys (a sliding-window layer); `sinks` [heads]: attention-sink logits.

    split_k=False runs every sequence in one program per KV head (one partition as long as the table), for
    tests and the benchmark; partition_size (a multiple of tile), tile, num_warps and num_stages are tuning
    knobs the benchmark sweeps. The defaults are the engine's path.
    """
    batch, heads, head_dim = q.shape
    kv_heads, block_size = pool_geometry(heads, k_cache)
    if tile < 16 or tile & (tile - 1) or partition_size % tile:
        raise ValueError(f"tile {tile} must be a power of two >= 16 dividing partition_size {partition_size}")
    q, k_cache, v_cache = q.contiguous(), k_cache.contiguous(), v_cache.contiguous()
    block_tables, seq_lens = block_tables.to(torch.int32).contiguous(), seq_lens.to(torch.int32).contiguous()
    out = torch.empty_like(q)
    capacity = block_tables.shape[1] * block_size  # bounds every length without reading seq_lens on the host
    partition = partition_size if split_k else triton.cdiv(capacity, tile) * tile
    max_parts = triton.cdiv(capacity, partition)
    # Partials, written only for sequences that split (one partition writes `out` directly).
    m = torch.empty((batch, heads, max_parts), dtype=torch.float32, device=q.device)
    l = torch.empty_like(m)
    acc = torch.empty((batch, heads, max_parts, head_dim), dtype=torch.float32, device=q.device)
    group = heads // kv_heads
    block_d = max(16, triton.next_power_of_2(head_dim))  # tl.dot needs every dimension >= 16
    sink_log2 = sink_logits(sinks, q)  # the decode kernel's and the reduction's
    _paged_decode_kernel[(max_parts, batch, kv_heads)](
        q, k_cache, v_cache, out, m, l, acc, block_tables, seq_lens, sink_log2, scale * LOG2E, partition,
        max_parts, window,
        q.stride(0), q.stride(1), k_cache.stride(1), k_cache.stride(2), k_cache.stride(0),
        block_tables.stride(0), out.stride(0), out.stride(1),
        HEADS=heads, GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim, BLOCK_D=block_d, TILE=tile,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # fp32 inputs stay fp32; tf32 is ignored for 16-bit
        HAS_SINKS=sinks is not None,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    if max_parts > 1:
        _reduce_partitions_kernel[(batch, heads)](
            out, m, l, acc, seq_lens, sink_log2, partition, max_parts, out.stride(0), out.stride(1),
            HEADS=heads, HEAD_DIM=head_dim, BLOCK_D=block_d, CHUNK=_REDUCE_CHUNK, HAS_SINKS=sinks is not None,
        )  # fmt: skip
    return out
