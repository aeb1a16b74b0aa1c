"""The CPU kernels on float16 K/V pools. The store rounds K/V to fp16 as torch's .half() does (the torch path's
write_kv stores the same bits); attention widens K and V back to fp32, which is exact (a decode row's tile into
scratch, prompt rows' vectors as they load), and runs the fp32 loops on them. So on fp16 pools a kernel is bit for
bit the fp32 kernel on the rounded values, and as close to the fp64 reference on those values as on fp32 pools.
(Batch invariance on fp16 pools: test_paged_prefill.py.)"""

from __future__ import annotations

import pytest
import torch

from inferplug.kernels.paged_attention_ref import paged_attention_decode_ref, paged_attention_ref, random_pool
from inferplug.ops.attention import write_kv
from tests.kernels.cpu.test_layer_ops import BLOCK_SIZE, BLOCKS, HEADS, KV_HEADS, tables
from tests.kernels.cpu.test_paged_prefill import chunked_inputs, rel_err


def fp16_pools(**shape):
    q, k_cache, v_cache, block_tables, starts, lens = chunked_inputs(**shape)
    return q, k_cache.half(), v_cache.half(), block_tables, starts, lens


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (9, 3), (12, 2), (16, 2)])  # GQA ratios 1, 3, 6 and 8
@pytest.mark.parametrize("head_dim", [64, 128, 40])  # 40: a width the AVX-512 vectors do not divide (8-lane kernel)
@pytest.mark.parametrize("threads", [1, 2])
def test_attention_on_fp16_pools_is_the_fp32_kernel_on_the_rounded_values(ops, heads, kv_heads, head_dim, threads):
    q, k_cache, v_cache, block_tables, starts, lens = fp16_pools(heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    scale = head_dim**-0.5
    out = torch.full_like(q, float("nan"))  # poisoned: an element the kernel does not write fails
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        ops.paged_attention(q, k_cache, v_cache, block_tables, starts, lens, scale, out=out)
    finally:
        torch.set_num_threads(before)
    exact = paged_attention_ref(q, k_cache, v_cache, block_tables, starts, lens, scale)  # the fp16 values, in fp64
    assert out.isfinite().all() and rel_err(out, exact) < 1e-6
    widened = ops.paged_attention(q, k_cache.float(), v_cache.float(), block_tables, starts, lens, scale)
    assert torch.equal(out, widened)


@pytest.mark.parametrize("block_size", [4, 16])
def test_decode_on_fp16_pools_matches_the_dense_reference(ops, block_size):
    seq_lens = [1, block_size, 3 * block_size, 2 * block_size + 1, 7, 50, 300]
    q, k_cache, v_cache, block_tables, lens = random_pool(batch=len(seq_lens), heads=9, kv_heads=3, head_dim=64,
                                                          block_size=block_size, seq_lens=seq_lens)
    k_cache, v_cache, block_tables, lens = k_cache.half(), v_cache.half(), block_tables.long(), lens.long()
    out = ops.paged_decode(q, k_cache, v_cache, block_tables, lens, 0.125)
    expected = paged_attention_decode_ref(q, k_cache, v_cache, block_tables, lens, 0.125)  # widens the pools to fp32
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(out, ops.paged_decode(q, k_cache.float(), v_cache.float(), block_tables, lens, 0.125))


def test_the_store_rounds_to_fp16_as_torch_does(ops):
    """Every rounding case: ties to even, past fp16's largest (65504) to inf, subnormals, underflow to zero,
    signed zero and NaN; head_dim 12 has a 4-value tail past the 8-lane conversions."""
    d, tokens = 12, 8
    cos, signed_sin = (t[:, :d] for t in tables())  # only position 0 is used: cos 1, sin 0
    special = torch.tensor([1 + 2**-11, 1 + 3 * 2**-11, 65504, 65519, 65520, -1e6, 2**-24 * 1.5, 2**-26, -0.0,
                            float("nan"), 3e-5, 1 / 3])
    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(tokens, (HEADS + 2 * KV_HEADS) * d, generator=gen) * 1000
    qkv.view(tokens, -1, d)[0, HEADS + KV_HEADS:] = special  # the v heads are stored unrotated
    slots = torch.randperm(BLOCKS * BLOCK_SIZE, generator=gen)[:tokens]
    positions = torch.zeros(tokens, dtype=torch.long)
    shape = (KV_HEADS, BLOCKS, BLOCK_SIZE, d)
    k_ref, v_ref = torch.zeros(shape, dtype=torch.float16), torch.zeros(shape, dtype=torch.float16)
    heads = qkv.view(tokens, -1, d)
    write_kv(k_ref, v_ref, heads[:, HEADS:HEADS + KV_HEADS], heads[:, HEADS + KV_HEADS:], slots)  # torch's cast
    k_cache, v_cache = torch.zeros_like(k_ref), torch.zeros_like(v_ref)
    ops.rope_write_kv_(qkv.clone(), positions, cos.contiguous(), signed_sin.contiguous(), k_cache, v_cache, slots, HEADS)
    assert torch.equal(k_cache.view(torch.int16), k_ref.view(torch.int16))  # bits: NaN and -0.0 included
    assert torch.equal(v_cache.view(torch.int16), v_ref.view(torch.int16))


@pytest.mark.parametrize("k_dtype,v_dtype", [(torch.float16, torch.float32), (torch.bfloat16, torch.bfloat16)])
def test_mixed_or_bf16_pools_are_refused(ops, k_dtype, v_dtype):
    q, k_cache, v_cache, block_tables, starts, lens = chunked_inputs(heads=4, kv_heads=2, head_dim=64)
    k_cache, v_cache = k_cache.to(k_dtype), v_cache.to(v_dtype)
    with pytest.raises(RuntimeError, match="both float32 or both float16"):
        ops.paged_attention(q, k_cache, v_cache, block_tables, starts, lens, 0.125)
    cos, signed_sin = tables()
    qkv = torch.randn(1, (HEADS + 2 * KV_HEADS) * 64)
    k_pool = torch.zeros(KV_HEADS, BLOCKS, BLOCK_SIZE, 64, dtype=k_dtype)
    v_pool = torch.zeros(KV_HEADS, BLOCKS, BLOCK_SIZE, 64, dtype=v_dtype)
    with pytest.raises(RuntimeError, match="both float32 or both float16"):
        ops.rope_write_kv_(qkv, torch.tensor([0]), cos, signed_sin, k_pool, v_pool, torch.tensor([0]), HEADS)
