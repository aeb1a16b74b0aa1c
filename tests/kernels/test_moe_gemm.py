"""The Triton grouped expert GEMM (kernels/moe_gemm.py) against its torch specification, and the layout of slots
against a plain per-expert loop; its MXFP4 experts against gguf-py's dequantization of the same blocks; in Triton's
interpreter here, on CUDA where there is one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from inferplug.kernels.moe_gemm_ref import MXFP4Experts, expert_tiles, grouped_matmul_ref

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


def _mxfp4_experts(experts: int, n: int, k: int, seed: int = 0) -> tuple[MXFP4Experts, list[torch.Tensor]]:
    """Random GGUF MXFP4 experts (each [n, k / 32 * 17] bytes: the E8M0 byte, then 16 of codes, a block) as
    MXFP4Linear's rows, stacked; and the GGUF bytes. Torch alone: the GPU check's image has no gguf-py."""
    from inferplug.models.gguf_layers import mxfp4_scale_field
    from inferplug.models.gguf_random import random_blocks
    from inferplug.quant.block_linear import MXFP4Linear

    g = torch.Generator().manual_seed(seed)
    raws = [random_blocks("MXFP4", (n, k), 0.02, g) for _ in range(experts)]
    rows = [MXFP4Linear.pack_fields(mxfp4_scale_field(blocks[:, 0]).reshape(n, -1, 2), blocks[:, 1:].reshape(n, -1, 16))
            for blocks in (raw.reshape(-1, 17) for raw in raws)]
    return MXFP4Experts(torch.stack(rows), k), raws


def _gguf_py_values(raws: list[torch.Tensor], n: int, k: int) -> torch.Tensor:
    import gguf

    values = [gguf.quants.dequantize(raw.numpy(), gguf.GGMLQuantizationType.MXFP4) for raw in raws]
    return torch.stack([torch.from_numpy(np.ascontiguousarray(v)).reshape(n, k) for v in values])


@pytest.mark.parametrize("k", [512, 640])  # 640: a run of 16 blocks, then a short one of 4
def test_mxfp4_experts_read_as_gguf_py_reads_their_blocks(k):
    experts, raws = _mxfp4_experts(3, 40, k)
    assert torch.equal(experts.dequantized(), _gguf_py_values(raws, 40, k))


@pytest.mark.parametrize("tokens", [1, 37])
def test_kernel_dequantizes_mxfp4_experts_and_adds_their_bias(tokens):
    """gpt-oss's experts: MXFP4 blocks, a bias each. The kernel reads the blocks as they sit in memory, no float copy
    of the weight; against gguf-py's values in float64."""
    experts, raws = _mxfp4_experts(4, 48, 640, seed=1)
    values = _gguf_py_values(raws, 48, 640)
    x, _, chosen = _inputs(tokens=tokens, experts=4, top_k=2, n=48, k=640, seed=2)
    bias = torch.randn(4, 48, generator=torch.Generator().manual_seed(3))
    pairs, tile_experts = expert_tiles(chosen, 4, 16)
    rows = torch.where(pairs >= 0, pairs // 2, -1)
    got = grouped_matmul(x, experts, rows, tile_experts, bias)
    expected = grouped_matmul_ref(x.double(), values.double(), rows, tile_experts, 16, bias.double())
    assert relative_error(got, expected) < 1e-6
    assert torch.equal(got[pairs < 0], torch.zeros_like(got[pairs < 0]))  # padding slots stay 0, bias or not


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_at_gpt_oss_20b_shapes_with_mxfp4_experts():
    """32 experts, 4 a token, 2880 wide, gate and up 5760 rows, 64 tokens, bf16 activations; against the
    specification's reading of the blocks (checked against gguf-py above)."""
    experts, _ = _mxfp4_experts(32, 5760, 2880)
    x, _, chosen = _inputs(tokens=64, experts=32, top_k=4, n=8, k=2880, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(32, 5760, device="cuda")
    pairs, tile_experts = expert_tiles(chosen, 32, 16)
    rows = torch.where(pairs >= 0, pairs // 4, -1)
    on_gpu = MXFP4Experts(experts.blocks.cuda(), experts.in_features)
    got = grouped_matmul(x, on_gpu, rows, tile_experts, bias)
    assert relative_error(got, grouped_matmul_ref(x, on_gpu, rows, tile_experts, 16, bias)) < 1e-2
