"""Triton grouped expert GEMM for an MoE layer on CUDA (vLLM's fused_moe is the anchor): one launch multiplies
every expert a step selected, each by the rows that chose it, so an expert's weight is read once per row tile
however many rows share it. Rows come through an index (no gathered copy of the input); the layout of slots is
moe_gemm_ref.expert_tiles' (expert by expert, padded to whole tiles). Specification: moe_gemm_ref.py."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_M, BLOCK_N, BLOCK_K = 16, 64, 32
NUM_WARPS = 4


@triton.jit
def _grouped_kernel(x_ptr, w_ptr, out_ptr, rows_ptr, tile_experts_ptr, N, K, stride_xm, stride_we, stride_wn,
                    stride_om, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    PRECISION: tl.constexpr):  # fmt: skip
    tile, col_tile = tl.program_id(0), tl.program_id(1)
    expert = tl.load(tile_experts_ptr + tile).to(tl.int64)
    slots = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = tl.load(rows_ptr + slots)
    row_ok = rows >= 0
    cols = col_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, K, BLOCK_K):  # a fixed order over K: a row's sums do not depend on its tile's other rows
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        a = tl.load(x_ptr + tl.where(row_ok, rows, 0).to(tl.int64)[:, None] * stride_xm + ks[None, :],
                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(w_ptr + expert * stride_we + cols[None, :].to(tl.int64) * stride_wn + ks[:, None],
                    mask=col_ok[None, :] & k_ok[:, None], other=0.0)
        acc += tl.dot(a, b.to(a.dtype), input_precision=PRECISION)
    tl.store(out_ptr + slots[:, None].to(tl.int64) * stride_om + cols[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])


def grouped_matmul(x: torch.Tensor, weights: torch.Tensor, rows: torch.Tensor, tile_experts: torch.Tensor,
                   block_m: int = BLOCK_M, block_n: int = BLOCK_N, block_k: int = BLOCK_K) -> torch.Tensor:
    """grouped_matmul_ref's contract: x [M, K], weights [E, N, K] (unit stride over K), rows [P] (-1: padding),
    tile_experts [P // block_m] -> [P, N] (padding rows left 0)."""
    if x.stride(1) != 1 or weights.stride(2) != 1:
        raise ValueError("grouped_matmul needs unit-stride rows in x and in each expert's weight")
    slots, n, k = len(rows), weights.shape[1], weights.shape[2]
    out = torch.zeros(slots, n, dtype=x.dtype, device=x.device)
    if slots == 0:
        return out
    _grouped_kernel[(slots // block_m, triton.cdiv(n, block_n))](
        x, weights, out, rows.contiguous(), tile_experts.contiguous(), n, k, x.stride(0), weights.stride(0),
        weights.stride(1), out.stride(0), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32", num_warps=NUM_WARPS,
    )  # fmt: skip
    return out
