"""Triton kernels for a decoder layer's small ops on CUDA: the KV store through the slot mapping, RMSNorm
fused with the residual add, and RoPE in place. Specifications: layer_ops_ref.py. fp16/bf16/fp32 inputs,
fp32 arithmetic. Each is one pass over its rows, where torch takes two to four kernels and their round trips."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slots_ptr, stride_kt, stride_kh, stride_vt, stride_vh,
                     stride_ch, stride_cs, KV_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                     BLOCK_D: tl.constexpr):  # fmt: skip
    token = tl.program_id(0)
    slot = tl.load(slots_ptr + token).to(tl.int64)
    if slot < 0:  # a padded row (CUDA graphs) or one that stores nothing
        return
    heads = tl.arange(0, HEADS_PAD)
    dims = tl.arange(0, BLOCK_D)
    mask = (heads < KV_HEADS)[:, None] & (dims < HEAD_DIM)[None, :]
    dst = heads[:, None] * stride_ch + slot * stride_cs + dims[None, :]  # a pool's slot s is block s // bs, row s % bs
    k = tl.load(k_ptr + token * stride_kt + heads[:, None] * stride_kh + dims[None, :], mask=mask)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    v = tl.load(v_ptr + token * stride_vt + heads[:, None] * stride_vh + dims[None, :], mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def store_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
    """store_kv_ref's contract: k, v [T, kv_heads, D] (any row and head strides) into the pools at `slots`."""
    tokens, kv_heads, head_dim = k.shape
    if k.stride(2) != 1 or v.stride(2) != 1 or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("store_kv needs unit-stride head_dim rows and contiguous pools")
    if tokens == 0:
        return
    _store_kv_kernel[(tokens,)](
        k, v, k_cache, v_cache, slots, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(2), KV_HEADS=kv_heads, HEADS_PAD=triton.next_power_of_2(kv_heads),
        HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim),
    )  # fmt: skip


@triton.jit
def _add_rms_norm_kernel(x_ptr, delta_ptr, w_ptr, out_ptr, eps, N: tl.constexpr, BLOCK: tl.constexpr,
                         HAS_DELTA: tl.constexpr):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0)
    if HAS_DELTA:  # the residual add, rounded to x's dtype as torch's add_ rounds it, written back
        x = x + tl.load(delta_ptr + row * N + cols, mask=mask, other=0.0)
        tl.store(x_ptr + row * N + cols, x, mask=mask)
    x32 = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x32 * x32, axis=0) / N + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    out = (x32 * rstd).to(x.dtype) * w  # HF rounds the normalised row to the dtype before the weight
    tl.store(out_ptr + row * N + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """add_rms_norm_ref's contract: x [T, N] contiguous, updated in place when delta is given."""
    if not x.is_contiguous() or (delta is not None and not delta.is_contiguous()):
        raise ValueError("add_rms_norm needs contiguous rows")
    out = torch.empty_like(x)
    rows, n = x.shape
    if rows:
        _add_rms_norm_kernel[(rows,)](x, x if delta is None else delta, weight, out, eps, N=n,
                                      BLOCK=triton.next_power_of_2(n), HAS_DELTA=delta is not None)
    return out


@triton.jit
def _rope_kernel(x_ptr, positions_ptr, cos_ptr, sin_ptr, stride_xt, stride_xh, stride_table, HEADS: tl.constexpr,
                 HEADS_PAD: tl.constexpr, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr):  # fmt: skip
    token = tl.program_id(0)
    position = tl.load(positions_ptr + token).to(tl.int64)
    heads = tl.arange(0, HEADS_PAD)
    dims = tl.arange(0, BLOCK_HALF)
    mask = (heads < HEADS)[:, None] & (dims < HALF)[None, :]
    first = x_ptr + token.to(tl.int64) * stride_xt + heads[:, None] * stride_xh + dims[None, :]
    x1 = tl.load(first, mask=mask)
    x2 = tl.load(first + HALF, mask=mask)
    table = position * stride_table + dims
    cos1 = tl.load(cos_ptr + table, mask=dims < HALF).to(x1.dtype)[None, :]  # rounded as the torch path rounds them
    cos2 = tl.load(cos_ptr + table + HALF, mask=dims < HALF).to(x1.dtype)[None, :]
    sin1 = tl.load(sin_ptr + table, mask=dims < HALF).to(x1.dtype)[None, :]  # signed: -sin
    sin2 = tl.load(sin_ptr + table + HALF, mask=dims < HALF).to(x1.dtype)[None, :]  # +sin
    tl.store(first, x1 * cos1 + x2 * sin1, mask=mask)
    tl.store(first + HALF, x2 * cos2 + x1 * sin2, mask=mask)


def rope_(qk: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """rope_ref's result written into qk ([T, heads, D], unit stride over D) in place; returns qk."""
    tokens, heads, head_dim = qk.shape
    if qk.stride(2) != 1 or head_dim % 2:
        raise ValueError("rope_ needs an even head_dim of unit stride")
    if tokens:
        _rope_kernel[(tokens,)](qk, positions, cos, signed_sin, qk.stride(0), qk.stride(1), cos.stride(0),
                                HEADS=heads, HEADS_PAD=triton.next_power_of_2(heads), HALF=head_dim // 2,
                                BLOCK_HALF=triton.next_power_of_2(head_dim // 2))  # fmt: skip
    return qk
