"""The Triton paged-attention decode kernel against its pure-torch reference, torch's SDPA (an independent
reference, tests/sdpa_reference.py) and the engine's CPU path."""

from __future__ import annotations

import pytest
import torch

from kernels.paged_attention_ref import paged_attention_decode_ref, random_pool
from sdpa_reference import sdpa_decode

from kernels.paged_attention import paged_attention_decode  # imports triton; conftest set the interpreter first


@pytest.mark.parametrize(
    "heads,kv_heads,head_dim,block_size,seq_lens",
    [(4, 2, 16, 4, [1, 5, 11]), (3, 1, 12, 8, [8, 3]), (2, 2, 8, 2, [7])],
)
def test_kernel_matches_reference(heads, kv_heads, head_dim, block_size, seq_lens):
    q, k_cache, v_cache, tables, lens = random_pool(
        batch=len(seq_lens), heads=heads, kv_heads=kv_heads, head_dim=head_dim, block_size=block_size, seq_lens=seq_lens
    )
    scale = head_dim**-0.5
    expected = paged_attention_decode_ref(q, k_cache, v_cache, tables, lens, scale)
    torch.testing.assert_close(expected, sdpa_decode(q, k_cache, v_cache, tables, lens, scale))  # fp32 both
    torch.testing.assert_close(paged_attention_decode(q, k_cache, v_cache, tables, lens, scale), expected, rtol=1e-4, atol=1e-5)


def test_reference_matches_the_engine_cpu_decode_path():
    from inferplug.engine.attention import DecodeGroup, _decode

    seq_lens = [3, 9]
    q, k_cache, v_cache, tables, lens = random_pool(batch=2, heads=4, kv_heads=2, head_dim=8, block_size=4, seq_lens=seq_lens)
    positions = torch.arange(tables.shape[1] * 4)
    bias = torch.where(positions[None, :] < lens[:, None], 0.0, float("-inf")).view(1, 2, 1, -1)
    rows = DecodeGroup(0, 2, tables.long(), bias)
    engine = _decode(q, k_cache, v_cache, rows, 8**-0.5)
    torch.testing.assert_close(paged_attention_decode_ref(q, k_cache, v_cache, tables, lens, 8**-0.5), engine)


def test_block_size_must_be_a_power_of_two():
    q, k_cache, v_cache, tables, lens = random_pool(batch=1, heads=2, kv_heads=1, head_dim=8, block_size=3, seq_lens=[4])
    with pytest.raises(ValueError, match="power of two"):
        paged_attention_decode(q, k_cache, v_cache, tables, lens, 1.0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_kernel_on_cuda_at_smollm2_shapes():
    seq_lens = [1, 17, 300, 1024, 77]
    q, k_cache, v_cache, tables, lens = random_pool(batch=5, heads=9, kv_heads=3, head_dim=64, block_size=16,
                                                    seq_lens=seq_lens, device="cuda", dtype=torch.bfloat16)  # fmt: skip
    got = paged_attention_decode(q, k_cache, v_cache, tables, lens, 0.125)
    for expected in (paged_attention_decode_ref(q, k_cache, v_cache, tables, lens, 0.125),
                     sdpa_decode(q, k_cache, v_cache, tables, lens, 0.125)):
        # bf16 output: 2^-8 relative rounding on values of order 1, plus bf16 inputs to the kernel's dot products
        torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)
