"""Triton paged-attention decode: one query per sequence, K/V read through block tables.

Pool layout as the engine allocates it (inferplug/models/llama.py allocate_kv_cache):
[kv_heads, num_blocks, block_size, head_dim]. One program per (sequence, query head) walks the
sequence's blocks with an online softmax (running max and sum), so no [S] score row is kept and
K/V are read once per head. GQA: head h reads kv head h // (heads // kv_heads).
Reference: kernels/paged_attention_ref.py. Tests run it under TRITON_INTERPRET=1 on the CPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _paged_decode_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, tables_ptr, lens_ptr, scale,
    stride_qb, stride_qh, stride_cb, stride_cs, stride_ch, stride_tb, stride_ob, stride_oh,
    GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    seq, head = tl.program_id(0), tl.program_id(1)
    kv_head = head // GROUP
    length = tl.load(lens_ptr + seq)
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM
    slots = tl.arange(0, BLOCK_SIZE)
    q = tl.load(q_ptr + seq * stride_qb + head * stride_qh + dims, mask=dim_ok, other=0.0).to(tl.float32)

    running_max = tl.full((), float("-inf"), tl.float32)
    running_sum = tl.zeros((), tl.float32)
    acc = tl.zeros((BLOCK_D,), tl.float32)
    for logical in range(0, tl.cdiv(length, BLOCK_SIZE)):
        block = tl.load(tables_ptr + seq * stride_tb + logical).to(tl.int64)
        offsets = block * stride_cb + slots[:, None] * stride_cs + kv_head * stride_ch + dims[None, :]
        valid = (logical * BLOCK_SIZE + slots) < length
        mask = valid[:, None] & dim_ok[None, :]
        k = tl.load(k_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        scores = tl.sum(k * q[None, :], axis=1) * scale
        scores = tl.where(valid, scores, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, axis=0))
        correction = tl.exp(running_max - new_max)
        probs = tl.exp(scores - new_max)
        v = tl.load(v_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        acc = acc * correction + tl.sum(probs[:, None] * v, axis=0)
        running_sum = running_sum * correction + tl.sum(probs, axis=0)
        running_max = new_max
    out = acc / running_sum
    tl.store(out_ptr + seq * stride_ob + head * stride_oh + dims, out.to(out_ptr.dtype.element_ty), mask=dim_ok)


def paged_attention_decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
) -> torch.Tensor:  # fmt: skip
    """Same contract as paged_attention_decode_ref: q [B, heads, D] -> [B, heads, D]."""
    batch, heads, head_dim = q.shape
    kv_heads, block_size = k_cache.shape[0], k_cache.shape[2]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads do not split evenly over {kv_heads} KV heads")
    if block_size & (block_size - 1):
        raise ValueError(f"block_size {block_size} must be a power of two for the Triton kernel")
    q, k_cache, v_cache = q.contiguous(), k_cache.contiguous(), v_cache.contiguous()
    block_tables, seq_lens = block_tables.to(torch.int32).contiguous(), seq_lens.to(torch.int32).contiguous()
    out = torch.empty_like(q)
    _paged_decode_kernel[(batch, heads)](
        q, k_cache, v_cache, out, block_tables, seq_lens, scale,
        q.stride(0), q.stride(1), k_cache.stride(1), k_cache.stride(2), k_cache.stride(0),
        block_tables.stride(0), out.stride(0), out.stride(1),
        GROUP=heads // kv_heads, BLOCK_SIZE=block_size, HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim),
    )  # fmt: skip
    return out
