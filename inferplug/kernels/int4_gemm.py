"""Triton int4 group-wise dequant-GEMM for AWQ / GPTQ layers on CUDA: out = x @ w, w unpacked tile by tile.

Layout and meaning: int4_gemm_ref.py (the specification; tests run this kernel against it under TRITON_INTERPRET=1).
Each program computes a [BLOCK_M, BLOCK_N] tile of the output, walking K in BLOCK_K steps: it loads the int32
words holding BLOCK_K inputs (8 a word), shifts out each input's nibble, subtracts its group's zero and multiplies
by its group's scale in fp32, rounds to x's dtype and accumulates tl.dot in fp32. Any group size works (the group
of input k is k // G), and the K walk is in the same fixed steps whatever M is, so a row's result does not depend
on its batch (DESIGN.md: batch-invariant ops).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_M, BLOCK_N, BLOCK_K = 16, 64, 32  # tl.dot needs >= 16 on every side


@triton.jit
def _int4_gemm_kernel(
    x_ptr, qweight_ptr, scales_ptr, zeros_ptr, out_ptr, M, N, K, group_size,
    stride_xm, stride_qk, stride_sg, stride_zg, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < M, cols < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_xm + ks[None, :], mask=row_ok[:, None] & k_ok[None, :],
                    other=0.0)
        w_mask = k_ok[:, None] & col_ok[None, :]
        words = tl.load(qweight_ptr + (ks // 8)[:, None].to(tl.int64) * stride_qk + cols[None, :], mask=w_mask, other=0)
        q = (words >> ((ks % 8) * 4)[:, None]) & 15
        groups = (ks // group_size)[:, None].to(tl.int64)
        scale = tl.load(scales_ptr + groups * stride_sg + cols[None, :], mask=w_mask, other=0.0)
        zero = tl.load(zeros_ptr + groups * stride_zg + cols[None, :], mask=w_mask, other=0)
        w = ((q.to(tl.float32) - zero.to(tl.float32)) * scale.to(tl.float32)).to(x.dtype)
        acc += tl.dot(x, w, input_precision=PRECISION)
    out = out_ptr + rows[:, None].to(tl.int64) * stride_om + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def int4_gemm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
              group_size: int) -> torch.Tensor:
    """x [M, K] (contiguous rows) @ the int4 weight [K, N] -> [M, N] in x's dtype."""
    x = x.contiguous()
    (m, k), n = x.shape, qweight.shape[1]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(m, BLOCK_M), triton.cdiv(n, BLOCK_N))
    _int4_gemm_kernel[grid](
        x, qweight, scales, zeros, out, m, n, k, group_size,
        x.stride(0), qweight.stride(0), scales.stride(0), zeros.stride(0), out.stride(0),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, PRECISION="ieee",
    )  # fmt: skip
    return out
