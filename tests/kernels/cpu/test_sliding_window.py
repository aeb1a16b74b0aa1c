"""The C++ paged attention kernel with a sliding window (Gemma 3's local layers, Mistral's): each row attends to its
last `window` keys only, against the fp64 reference; its batch invariance holds with the window as without it; and
the torch path masks the same keys."""

from __future__ import annotations

import pytest
import torch

from inferplug.kernels.paged_attention_ref import paged_attention_ref
from tests.kernels.cpu.test_paged_prefill import chunked_inputs, rel_err

# windows shorter than a key tile, one tile, between tiles, and longer than every context (no effect)
WINDOWS = [1, 5, 32, 47, 1000]


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 4, 64), (9, 3, 128), (4, 1, 256)])  # Gemma 3 270M: 4/1/256
@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.float16])
def test_window_matches_the_fp64_reference(ops, window, heads, kv_heads, head_dim, pool_dtype):
    q, k_cache, v_cache, tables, starts, lens = chunked_inputs(heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    k_cache, v_cache = k_cache.to(pool_dtype), v_cache.to(pool_dtype)
    out = ops.paged_attention(q, k_cache, v_cache, tables, starts, lens, head_dim**-0.5, window=window)
    exact = paged_attention_ref(q, k_cache, v_cache, tables, starts, lens, head_dim**-0.5, window=window)
    assert out.isfinite().all()
    for s in range(len(lens)):
        rows = slice(int(starts[s]), int(starts[s + 1]))
        assert rel_err(out[rows], exact[rows]) < 1e-6, f"sequence {s}"
    if window >= int(lens.max()):  # a window longer than the context is no window, bit for bit
        assert torch.equal(out, ops.paged_attention(q, k_cache, v_cache, tables, starts, lens, head_dim**-0.5))


@pytest.mark.parametrize("window", [5, 47])
def test_a_windowed_row_is_the_same_in_any_chunking(ops, window):
    """A 300-row chunk's rows, one at a time as decode rows: bit for bit the same outputs."""
    q, k_cache, v_cache, tables, starts, lens = chunked_inputs(heads=6, kv_heads=2, head_dim=64, chunks=[300],
                                                               prefixes=[100])
    whole = ops.paged_attention(q, k_cache, v_cache, tables, starts, lens, 0.125, window=window)
    for row in (0, 1, 31, 32, 33, 150, 299):
        one = ops.paged_attention(q[row:row + 1], k_cache, v_cache, tables, torch.tensor([0, 1]),
                                  torch.tensor([100 + row + 1]), 0.125, window=window)
        assert torch.equal(one[0], whole[row]), f"row {row}"


@pytest.mark.parametrize("window", [5, 47])
def test_the_torch_path_masks_the_same_keys(ops, window):
    """ops/attention.py's paged_attention (decode groups and prefill chunks) against the same reference."""
    from inferplug.ops.attention import AttentionContext, PagedRows, PrefillChunk, paged_attention

    q, k_cache, v_cache, tables, starts, lens = chunked_inputs(heads=4, kv_heads=2, head_dim=64, chunks=[1, 1, 40],
                                                               prefixes=[60, 9, 20], seed=5)
    k_cache, v_cache = (c.nan_to_num(0.0) for c in (k_cache, v_cache))  # the torch path reads padded blocks
    exact = paged_attention_ref(q, k_cache, v_cache, tables, starts, lens, 0.125, window=window)
    width = tables.shape[1] * k_cache.shape[2]
    bias = torch.zeros(2, width).masked_fill_(torch.arange(width)[None, :] >= lens[:2, None], float("-inf"))
    ctx = AttentionContext(torch.zeros(0, dtype=torch.long), decode_rows=2)
    ctx.paged_rows = [PagedRows(0, 2, tables[:2], bias[None, :, None, :], lengths=lens[:2])]
    mask = torch.arange(60)[None, :] <= torch.arange(20, 60)[:, None]
    ctx.prefills = [PrefillChunk(2, 40, 60, tables[2, :4], mask)]
    out = paged_attention(q, q[:, :2], q[:, :2], k_cache, v_cache, ctx, 0.125, window).view(q.shape)
    assert rel_err(out, exact) < 1e-6
