"""Pure-torch specification of the grouped expert GEMM (moe_gemm.py): the rows each expert was chosen by, laid out
expert by expert and padded to whole row tiles, each tile multiplied by its own expert's weight."""

from __future__ import annotations

import torch


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


def grouped_matmul_ref(x: torch.Tensor, weights: torch.Tensor, rows: torch.Tensor, tile_experts: torch.Tensor,
                       block_m: int) -> torch.Tensor:
    """out[s] = x[rows[s]] @ weights[expert of s's tile].T for each slot s whose row is >= 0 (0 elsewhere).
    x [M, K]; weights [E, N, K]; rows [P]; returns [P, N] in x's dtype, fp32 accumulation."""
    out = torch.zeros(len(rows), weights.shape[1], dtype=x.dtype, device=x.device)
    for tile, expert in enumerate(tile_experts.tolist()):
        slots = torch.arange(tile * block_m, (tile + 1) * block_m, device=x.device)
        valid = slots[rows[slots] >= 0]
        out[valid] = (x[rows[valid]].float() @ weights[expert].float().T).to(x.dtype)
    return out
