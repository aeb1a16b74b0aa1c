"""Attention sinks (gpt-oss): each head's learned logit joins its queries' softmax denominators and adds no value.
The C++ kernel (fp32 and fp16 pools, with and without a sliding window) and the torch path (decode groups, prefill
chunks over a cached prefix and fresh ones) against the fp64 reference, which follows HF's eager attention (the
sink as a last score column, dropped after the softmax)."""

from __future__ import annotations

import pytest
import torch

from inferplug.kernels.paged_attention_ref import paged_attention_ref
from tests.kernels.cpu.test_paged_prefill import chunked_inputs, rel_err

# small and large logits against the scores: 30 outweighs every key (the kernel must not overflow taking it)
SINKS = torch.tensor([-2.0, 0.5, 3.0, 30.0, 1.0, -0.5])


@pytest.mark.parametrize("window", [0, 5, 47])
@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.float16])
def test_kernel_sinks_match_the_fp64_reference(ops, window, pool_dtype):
    q, k_cache, v_cache, tables, starts, lens = chunked_inputs(heads=6, kv_heads=2, head_dim=64)
    k_cache, v_cache = k_cache.to(pool_dtype), v_cache.to(pool_dtype)
    out = ops.paged_attention(q, k_cache, v_cache, tables, starts, lens, 0.125, window=window, sinks=SINKS)
    exact = paged_attention_ref(q, k_cache, v_cache, tables, starts, lens, 0.125, window=window, sinks=SINKS)
    plain = paged_attention_ref(q, k_cache, v_cache, tables, starts, lens, 0.125, window=window)
    assert out.isfinite().all()
    assert rel_err(out, exact) < 1e-6
    assert rel_err(plain, exact) > 1e-2  # the sinks matter at these sizes: the check above discriminates


def test_kernel_refuses_sinks_of_the_wrong_size(ops):
    q, k_cache, v_cache, tables, starts, lens = chunked_inputs(heads=6, kv_heads=2, head_dim=64)
    with pytest.raises(RuntimeError, match="one logit per query head"):
        ops.paged_attention(q, k_cache, v_cache, tables, starts, lens, 0.125, sinks=SINKS[:4])


@pytest.mark.parametrize("window", [0, 5])
def test_the_torch_path_takes_sinks_alike(window):
    """ops/attention.py's paged_attention: decode groups, a prefill chunk over a cached prefix (with a mask), and a
    fresh chunk (causal, no mask)."""
    from inferplug.ops.attention import AttentionContext, PagedRows, PrefillChunk, paged_attention

    q, k_cache, v_cache, tables, starts, lens = chunked_inputs(heads=6, kv_heads=2, head_dim=64, chunks=[1, 1, 40, 12],
                                                               prefixes=[60, 9, 20, 0], seed=5)
    k_cache, v_cache = (c.nan_to_num(0.0) for c in (k_cache, v_cache))  # the torch path reads padded blocks
    exact = paged_attention_ref(q, k_cache, v_cache, tables, starts, lens, 0.125, window=window, sinks=SINKS)
    width = tables.shape[1] * k_cache.shape[2]
    bias = torch.zeros(2, width).masked_fill_(torch.arange(width)[None, :] >= lens[:2, None], float("-inf"))
    ctx = AttentionContext(torch.zeros(0, dtype=torch.long), decode_rows=2)
    ctx.paged_rows = [PagedRows(0, 2, tables[:2], bias[None, :, None, :], lengths=lens[:2])]
    mask = torch.arange(60)[None, :] <= torch.arange(20, 60)[:, None]
    ctx.prefills = [PrefillChunk(2, 40, 60, tables[2, :4], mask), PrefillChunk(42, 12, 12, None, None)]
    fresh = slice(42, 54)  # a chunk with nothing cached attends to its own new K/V rows
    k_new, v_new = torch.zeros(54, 2, 64), torch.zeros(54, 2, 64)
    for pool, rows in ((k_cache, k_new), (v_cache, v_new)):
        rows[fresh] = pool[:, tables[3, 0]].transpose(0, 1)[:12]
    out = paged_attention(q, k_new, v_new, k_cache, v_cache, ctx, 0.125, window, SINKS).view(q.shape)
    assert rel_err(out, exact) < 1e-6
