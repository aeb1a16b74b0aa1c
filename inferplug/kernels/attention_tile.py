"""The inner step both Triton attention kernels share (paged_attention.py, prefill_attention.py): one tile of
keys gathered across pool blocks through a block table, folded into a flash-style online softmax."""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634  # the kernels' scores carry scale * log2(e), so exp2 replaces exp


@triton.jit
def attend_tile(q, k_ptr, v_ptr, table, kv_base, keys, key_ok, visible, dims, dim_ok, stride_cb, stride_cs, qk_scale,
                running_max, running_sum, acc, BLOCK_SIZE: tl.constexpr, PRECISION: tl.constexpr):  # fmt: skip
    """q [M, BLOCK_D] against the tile's `keys` (token indices; key_ok: inside the context; visible [M, N]: which
    query sees which key). Scores carry scale * log2(e), so exp2 replaces exp. Returns (max, sum, acc)."""
    blocks = tl.load(table + keys // BLOCK_SIZE, mask=key_ok, other=0).to(tl.int64)  # token t: block t // bs, row t % bs
    offsets = kv_base + blocks[:, None] * stride_cb + (keys % BLOCK_SIZE)[:, None] * stride_cs + dims[None, :]
    kv_mask = key_ok[:, None] & dim_ok[None, :]
    k = tl.load(k_ptr + offsets, mask=kv_mask, other=0.0).to(q.dtype)  # fp8 pools: read back upcast
    scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [M, N]
    scores = tl.where(visible, scores, float("-inf"))
    new_max = tl.maximum(running_max, tl.max(scores, axis=1))
    # a row that has seen no key yet (a sliding window's later rows in a tile before theirs) keeps max -inf, sum 0
    # and acc 0: the tile adds exactly nothing, so its result does not depend on where its query tile starts
    shift = tl.where(new_max == float("-inf"), 0.0, new_max)
    correction = tl.exp2(running_max - shift)
    probs = tl.exp2(scores - shift[:, None])
    v = tl.load(v_ptr + offsets, mask=kv_mask, other=0.0).to(q.dtype)
    acc = acc * correction[:, None] + tl.dot(probs.to(q.dtype), v, input_precision=PRECISION)
    running_sum = running_sum * correction + tl.sum(probs, axis=1)
    return new_max, running_sum, acc


@triton.jit
def sink_normalizer(running_max, running_sum, sink):
    """What multiplies the accumulated values (rows or one row) to normalize them by a softmax denominator with the
    attention sink's term in it, exp2(sink - max) (sink in the scores' log2 units), taken at the larger of the two
    maxima so neither overflows."""
    top = tl.maximum(running_max, sink)
    shift = tl.exp2(running_max - top)
    return shift / (running_sum * shift + tl.exp2(sink - top))


def sink_logits(sinks, q):
    """The kernels' sinks operand: [heads] fp32 in log2 units, or q as a placeholder the kernel never reads
    (HAS_SINKS False)."""
    return q if sinks is None else (sinks.float() * LOG2E).contiguous()


def pool_geometry(heads: int, k_cache) -> tuple[int, int]:
    """(kv_heads, block_size) of a [kv_heads, blocks, block_size, head_dim] pool, checked for the kernels."""
    kv_heads, block_size = k_cache.shape[0], k_cache.shape[2]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads do not split evenly over {kv_heads} KV heads")
    if block_size & (block_size - 1):
        raise ValueError(f"block_size {block_size} must be a power of two for the Triton kernel")
    return kv_heads, block_size
