"""Pure-torch specification of the grouped expert GEMM (moe_gemm.py): the rows each expert was chosen by, laid out
expert by expert and padded to whole row tiles, each tile multiplied by its own expert's weight (float, or MXFP4
blocks) and given its bias."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# E2M1's values doubled, bit 3 the sign: what an MXFP4 code times its block's scale is
E2M1_DOUBLED = torch.tensor([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=torch.float32)


@dataclass(frozen=True)
class MXFP4Experts:
    """Experts whose weights are MXFP4Linear's rows (quant/block_linear.py), stacked: `blocks` uint8 [E, N, K / 32
    * 18], `in_features` K."""

    blocks: torch.Tensor
    in_features: int

    def dequantized(self) -> torch.Tensor:
        """float32 [E, N, K], each input found by the layout's index arithmetic (the kernel's): per block b an fp16
        scale at byte 2b; then the code bytes, by runs of 16 blocks holding their 4-byte words in turn; byte j's
        low nibble codes input j of its block, its high nibble input j + 16."""
        blocks = self.in_features // 32
        k = torch.arange(self.in_features, device=self.blocks.device)
        b, i = k // 32, k % 32
        j, run = i % 16, b // 16 * 16
        at = 2 * blocks + run * 16 + (j // 4) * (blocks - run).clamp(max=16) * 4 + (b - run) * 4 + j % 4
        codes = (self.blocks[..., at].int() >> (i // 16 * 4)) & 15
        scales = self.blocks[..., :2 * blocks].contiguous().view(torch.float16).float()
        return E2M1_DOUBLED.to(codes.device)[codes] * scales[..., b]


def expert_tiles(chosen: torch.Tensor, experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The (row, choice) pairs of `chosen` ([T, k] expert ids) grouped by expert, each expert's run padded to a
    multiple of block_m: `pairs` [P] (flat pair index row * k + choice, -1 for padding) and `tile_experts`
    [P // block_m] (each tile's expert). Pairs keep their row order within an expert (a stable sort), so the
    layout depends on which rows chose an expert, never on a sort's tie order."""
    flat = chosen.flatten()
    order = torch.sort(flat, stable=True).indices
    counts = torch.bincount(flat, minlength=experts)
    padded = (counts + block_m - 1) // block_m * block_m
    starts = torch.cumsum(padded, 0) - padded
    firsts = torch.cumsum(counts, 0) - counts
    sorted_experts = flat[order]
    slots = starts[sorted_experts] + (torch.arange(len(flat), device=flat.device) - firsts[sorted_experts])
    pairs = torch.full((int(padded.sum()),), -1, dtype=torch.long, device=flat.device)
    pairs[slots] = order
    tile_experts = torch.repeat_interleave(torch.arange(experts, device=flat.device), padded // block_m)
    return pairs, tile_experts


def grouped_matmul_ref(x: torch.Tensor, weights: torch.Tensor | MXFP4Experts, rows: torch.Tensor,
                       tile_experts: torch.Tensor, block_m: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """out[s] = x[rows[s]] @ weights[expert of s's tile].T (+ bias[that expert]) for each slot s whose row is >= 0
    (0 elsewhere). x [M, K]; weights [E, N, K] or MXFP4Experts; rows [P]; bias [E, N]; returns [P, N] in x's dtype,
    fp32 accumulation."""
    if isinstance(weights, MXFP4Experts):
        weights = weights.dequantized()
    out = torch.zeros(len(rows), weights.shape[1], dtype=x.dtype, device=x.device)
    for tile, expert in enumerate(tile_experts.tolist()):
        slots = torch.arange(tile * block_m, (tile + 1) * block_m, device=x.device)
        valid = slots[rows[slots] >= 0]
        y = x[rows[valid]].float() @ weights[expert].float().T
        out[valid] = (y if bias is None else y + bias[expert].float()).to(x.dtype)
    return out
