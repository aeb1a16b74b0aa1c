"""The specification of the Triton int4 group-wise dequant-GEMM (int4_gemm.py), in plain torch.

Weight layout (quant/checkpoint_layers.py GroupInt4Linear): qweight int32 [K / 8, N], nibble i of word r holding
input row 8r + i (GPTQ's own packing, so the kernel reads 8 inputs per load); scales [K / G, N] in the compute
dtype; zeros uint8 [K / G, N]. w[k, n] = (q[k, n] - zeros[k // G, n]) * scales[k // G, n]; out = x @ w.
"""

from __future__ import annotations

import torch


def unpack_rows(qweight: torch.Tensor) -> torch.Tensor:
    """int32 [K / 8, N] -> uint8 [K, N]."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=qweight.device)
    return ((qweight.unsqueeze(1) >> shifts[None, :, None]) & 15).to(torch.uint8).flatten(0, 1)


def pack_rows(codes: torch.Tensor) -> torch.Tensor:
    """uint8 [K, N] (K divisible by 8) -> int32 [K / 8, N], the inverse of unpack_rows."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=codes.device)
    words = codes.int().unflatten(0, (-1, 8)) << shifts[None, :, None]
    packed = words[:, 0]
    for i in range(1, 8):  # OR, not sum: the top nibble sets the sign bit of the int32
        packed = packed | words[:, i]
    return packed


def dequantize(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int) -> torch.Tensor:
    """The float weight [K, N], (q - z) * s in fp32 (exact: 5 bits times an fp16 scale)."""
    groups = torch.arange(qweight.shape[0] * 8, device=qweight.device) // group_size
    return (unpack_rows(qweight).float() - zeros[groups].float()) * scales[groups].float()


def int4_gemm_ref(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                  group_size: int) -> torch.Tensor:
    """x [M, K] @ w [K, N]: w rounded to x's dtype (as the kernel feeds tl.dot), fp32 accumulation, x's dtype out."""
    return (x.float() @ dequantize(qweight, scales, zeros, group_size).to(x.dtype).float()).to(x.dtype)
