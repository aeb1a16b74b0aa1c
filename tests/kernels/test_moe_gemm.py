"""The Triton grouped expert GEMM (kernels/moe_gemm.py) against its torch specification, and the layout of slots
against a plain per-expert loop; in Triton's interpreter here, on CUDA where there is one."""

from __future__ import annotations

import pytest
import torch

from inferplug.kernels.moe_gemm_ref import expert_tiles, grouped_matmul_ref

from inferplug.kernels.moe_gemm import grouped_matmul  # imports triton: conftest set the interpreter first
from tests.kernels.kernel_checks import relative_error


def _inputs(tokens=37, experts=8, top_k=2, n=48, k=40, device="cpu", dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, k, generator=g).to(device, dtype)
    weights = torch.randn(experts, n, k, generator=g).to(device, dtype) * k**-0.5
    chosen = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)]).to(device)
    return x, weights, chosen


def test_the_layout_holds_each_pair_once_under_its_expert():
    _, _, chosen = _inputs()
    pairs, tile_experts = expert_tiles(chosen, 8, 16)
    assert len(pairs) % 16 == 0 and len(tile_experts) == len(pairs) // 16
    real = pairs[pairs >= 0]
    assert sorted(real.tolist()) == list(range(chosen.numel()))
    for slot, pair in enumerate(pairs.tolist()):
        if pair >= 0:
            assert chosen.flatten()[pair] == tile_experts[slot // 16]


@pytest.mark.parametrize("shape", [dict(), dict(tokens=1, top_k=2), dict(tokens=200, experts=16, top_k=4, n=96, k=64)])
def test_kernel_matches_the_specification(shape):
    x, weights, chosen = _inputs(**shape)
    pairs, tile_experts = expert_tiles(chosen, weights.shape[0], 16)
    rows = torch.where(pairs >= 0, pairs // chosen.shape[1], -1)  # each slot's input row: its pair's token
    got = grouped_matmul(x, weights, rows, tile_experts)
    expected = grouped_matmul_ref(x.double(), weights.double(), rows, tile_experts, 16)
    assert relative_error(got, expected) < 1e-6
    naive = torch.stack([x[t] @ weights[e].T for t, e in zip(*torch.where(chosen >= 0)) for e in [chosen[t, e]]])
    assert relative_error(got[pairs >= 0][torch.argsort(pairs[pairs >= 0])], naive.double()) < 1e-6


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_at_qwen3_30b_a3b_shapes_in_bf16():
    """128 experts, 8 a token, 2048 wide, expert MLP 768 (gate and up: 1536 rows), 64 tokens."""
    x, weights, chosen = _inputs(tokens=64, experts=128, top_k=8, n=1536, k=2048, device="cuda", dtype=torch.bfloat16)
    pairs, tile_experts = expert_tiles(chosen, 128, 16)
    rows = torch.where(pairs >= 0, pairs // 8, -1)
    got = grouped_matmul(x, weights, rows, tile_experts)
    assert relative_error(got, grouped_matmul_ref(x, weights, rows, tile_experts, 16)) < 1e-2
