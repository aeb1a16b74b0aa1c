"""Triton grouped expert GEMM for an MoE layer on CUDA (vLLM's fused_moe is the anchor): one launch multiplies
every expert a step selected, each by the rows that chose it, so an expert's weight is read once per row tile
however many rows share it. Rows come through an index (no gathered copy of the input); the layout of slots is
moe_gemm_ref.expert_tiles' (expert by expert, padded to whole tiles). The experts are float, or MXFP4 blocks
(gpt-oss's) in MXFP4Linear's rows, dequantized in the kernel a tile at a time; each expert may add a bias.
Specification: moe_gemm_ref.py."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from inferplug.kernels.moe_gemm_ref import MXFP4Experts

BLOCK_M, BLOCK_N, BLOCK_K = 16, 64, 32
NUM_WARPS = 4


@triton.jit
def _mxfp4_tile(row_ptrs, ks, mask, blocks):
    """The float weights [BLOCK_K, BLOCK_N] at inputs ks of the MXFP4Linear rows starting at row_ptrs
    (quant/block_linear.py): per block b, an fp16 scale at byte 2b; then the 16 code bytes of each block, by runs
    of 16 blocks holding their 4-byte words k = 0..3 in turn (the last run may be shorter); byte j's low nibble
    codes input j of its block, its high nibble input j + 16. A code is E2M1's value doubled (0, 1, 2, 3, 4, 6, 8,
    12; bit 3 its sign) times the scale."""
    b, i = ks // 32, ks % 32
    j = i % 16
    run = b // 16 * 16
    run_len = tl.minimum(16, blocks - run)
    at = 2 * blocks + run * 16 + (j // 4) * run_len * 4 + (b - run) * 4 + j % 4
    byte = tl.load(row_ptrs + at[:, None], mask=mask, other=0).to(tl.int32)
    code = (byte >> ((i // 16) * 4)[:, None]) & 15
    mag = code & 7
    value = tl.where(mag < 4, mag, (2 + (mag & 1)) << ((mag >> 1) - 1))
    value = tl.where(code >= 8, -value, value).to(tl.float32)
    low = tl.load(row_ptrs + (2 * b)[:, None], mask=mask, other=0).to(tl.int16)
    high = tl.load(row_ptrs + (2 * b + 1)[:, None], mask=mask, other=0).to(tl.int16)
    scale = (low | (high << 8)).to(tl.float16, bitcast=True).to(tl.float32)
    return value * scale


@triton.jit
def _grouped_kernel(x_ptr, w_ptr, bias_ptr, out_ptr, rows_ptr, tile_experts_ptr, N, K, stride_xm, stride_we, stride_wn,
                    stride_be, stride_om, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    PRECISION: tl.constexpr, MXFP4: tl.constexpr, HAS_BIAS: tl.constexpr):  # fmt: skip
    tile, col_tile = tl.program_id(0), tl.program_id(1)
    expert = tl.load(tile_experts_ptr + tile).to(tl.int64)
    slots = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = tl.load(rows_ptr + slots)
    row_ok = rows >= 0
    cols = col_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w_rows = w_ptr + expert * stride_we + cols[None, :].to(tl.int64) * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, K, BLOCK_K):  # a fixed order over K: a row's sums do not depend on its tile's other rows
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        a = tl.load(x_ptr + tl.where(row_ok, rows, 0).to(tl.int64)[:, None] * stride_xm + ks[None, :],
                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        if MXFP4:
            b = _mxfp4_tile(w_rows, ks, col_ok[None, :] & k_ok[:, None], K // 32)
        else:
            b = tl.load(w_rows + ks[:, None], mask=col_ok[None, :] & k_ok[:, None], other=0.0)
        acc += tl.dot(a, b.to(a.dtype), input_precision=PRECISION)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + expert * stride_be + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + slots[:, None].to(tl.int64) * stride_om + cols[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])


def grouped_matmul(x: torch.Tensor, weights: torch.Tensor | MXFP4Experts, rows: torch.Tensor,
                   tile_experts: torch.Tensor, bias: torch.Tensor | None = None, block_m: int = BLOCK_M,
                   block_n: int = BLOCK_N, block_k: int = BLOCK_K) -> torch.Tensor:
    """grouped_matmul_ref's contract: x [M, K], weights [E, N, K] (unit stride over K) or MXFP4Experts, rows [P]
    (-1: padding), tile_experts [P // block_m], bias [E, N] or None -> [P, N] (padding rows left 0)."""
    mxfp4 = isinstance(weights, MXFP4Experts)
    w = weights.blocks if mxfp4 else weights
    if x.stride(1) != 1 or w.stride(2) != 1 or (bias is not None and bias.stride(1) != 1):
        raise ValueError("grouped_matmul needs unit-stride rows in x, in each expert's weight and in its bias")
    if mxfp4 and block_k % 32:
        raise ValueError("grouped_matmul over MXFP4 blocks steps over K by whole blocks of 32")
    slots, n, k = len(rows), w.shape[1], weights.in_features if mxfp4 else w.shape[2]
    out = torch.zeros(slots, n, dtype=x.dtype, device=x.device)
    if slots == 0:
        return out
    _grouped_kernel[(slots // block_m, triton.cdiv(n, block_n))](
        x, w, out if bias is None else bias, out, rows.contiguous(), tile_experts.contiguous(), n, k, x.stride(0),
        w.stride(0), w.stride(1), 0 if bias is None else bias.stride(0), out.stride(0), BLOCK_M=block_m,
        BLOCK_N=block_n, BLOCK_K=block_k, PRECISION="ieee" if x.dtype == torch.float32 else "tf32", MXFP4=mxfp4,
        HAS_BIAS=bias is not None, num_warps=NUM_WARPS,
    )  # fmt: skip
    return out
