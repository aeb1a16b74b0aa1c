"""The C++ paged decode kernel (through the engine's decode dispatch) against the dense pure-torch reference."""

from __future__ import annotations

import pytest
import torch

from inferplug.kernels.paged_attention_ref import paged_attention_decode_ref, random_pool
from inferplug.ops.attention import AttentionContext, PagedRows
from inferplug.ops.cpu_ops import CpuKernelOps


def kernel_decode(ops, q, k_cache, v_cache, tables, lens, scale):
    """The engine's attention as CpuKernelOps runs it: one group of every row, each at its own length."""
    group = PagedRows(0, len(q), tables.long(), None, lengths=lens.long(),
                        query_starts=torch.arange(len(q) + 1))
    ctx = AttentionContext(slot_mapping=torch.empty(0, dtype=torch.long), decode_rows=len(q), paged_rows=[group])
    out = CpuKernelOps(ops, head_dim=q.shape[-1]).attention(q, None, None, k_cache, v_cache, ctx, scale)
    return out.view(q.shape)


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (9, 3), (8, 2)])  # GQA ratios 1, 3, 4
@pytest.mark.parametrize("head_dim", [64, 32])
@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("threads", [1, 2])
def test_matches_the_dense_reference(ops, heads, kv_heads, head_dim, block_size, threads):
    # one token, exact block multiples, one token past a block, and lengths across many 8-token chunks
    seq_lens = [1, block_size, 3 * block_size, 2 * block_size + 1, 7, 50, 300]
    q, k_cache, v_cache, tables, lens = random_pool(batch=len(seq_lens), heads=heads, kv_heads=kv_heads,
                                                    head_dim=head_dim, block_size=block_size, seq_lens=seq_lens)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = kernel_decode(ops, q, k_cache, v_cache, tables, lens, head_dim**-0.5)
    finally:
        torch.set_num_threads(before)
    expected = paged_attention_decode_ref(q, k_cache, v_cache, tables, lens, head_dim**-0.5)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_sharp_softmax_and_strided_query_rows(ops):
    """Scores in the hundreds (exp overflows without the max subtracted), and q as the model passes it: the
    query heads of a fused qkv row, so rows sit further apart than heads * head_dim."""
    q, k_cache, v_cache, tables, lens = random_pool(batch=3, heads=6, kv_heads=2, head_dim=16, block_size=4,
                                                    seq_lens=[9, 1, 33], seed=1)
    qkv = torch.cat([q * 40, torch.randn(3, 4, 16)], dim=1)  # 6 query heads, then 4 heads of k and v
    out = kernel_decode(ops, qkv[:, :6], k_cache, v_cache, tables, lens, 1.0)
    expected = paged_attention_decode_ref(q * 40, k_cache, v_cache, tables, lens, 1.0)
    assert out.isfinite().all()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("change,message", [
    (lambda args: {**args, "q": args["q"][..., :12].contiguous(), "k_cache": args["k_cache"][..., :12].contiguous(),
                   "v_cache": args["v_cache"][..., :12].contiguous()}, "multiple of 8"),
    (lambda args: {**args, "q": args["q"].double()}, "float32"),
    (lambda args: {**args, "block_tables": args["block_tables"] + 1000}, "outside the pool"),
    (lambda args: {**args, "context_lens": args["context_lens"] + 100}, "not covered"),
    (lambda args: {**args, "block_tables": args["block_tables"].int()}, "int64"),
])
def test_bad_inputs_are_refused(ops, change, message):
    q, k_cache, v_cache, tables, lens = random_pool(batch=2, heads=4, kv_heads=2, head_dim=16, block_size=4,
                                                    seq_lens=[5, 8])
    args = change(dict(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=tables.long(), context_lens=lens.long()))
    with pytest.raises(RuntimeError, match=message):
        ops.paged_decode(**args, scale=0.25)


# --- torch's SDPA as a second, independent reference (tests/sdpa_reference.py) --------------------------------
@pytest.mark.parametrize("heads,kv_heads,block_size", [(9, 3, 16), (8, 2, 4), (4, 4, 8)])
def test_matches_torch_sdpa(ops, heads, kv_heads, block_size):
    from tests.sdpa_reference import sdpa_decode

    seq_lens = [1, block_size, block_size + 1, 7, 50, 300]
    q, k_cache, v_cache, tables, lens = random_pool(batch=len(seq_lens), heads=heads, kv_heads=kv_heads, head_dim=64,
                                                    block_size=block_size, seq_lens=seq_lens, seed=2)
    out = kernel_decode(ops, q, k_cache, v_cache, tables, lens, 0.125)
    torch.testing.assert_close(out, sdpa_decode(q, k_cache, v_cache, tables, lens, 0.125), rtol=1e-5, atol=1e-5)
