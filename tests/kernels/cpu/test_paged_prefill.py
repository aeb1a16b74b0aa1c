"""The C++ paged attention kernel on prefill chunks (flash style: key tiles read through the block table, online
softmax) against the pure-torch reference in fp64, and its batch invariance: a row's output is bit for bit the same
as a decode row, alone, or in another chunking, on fp32 and on fp16 pools (fp16 pools: test_fp16_pools.py)."""

from __future__ import annotations

import pytest
import torch

from inferplug.kernels.paged_attention_ref import paged_attention_ref, random_pool

CHUNKS = [1, 15, 16, 17, 300]  # new query rows per sequence
PREFIXES = [0, 7, 16, 33, 100]  # cached tokens before each chunk: whole blocks and mid-block ends


def chunked_inputs(*, heads, kv_heads, head_dim, block_size=16, chunks=CHUNKS, prefixes=PREFIXES, seed=0):
    """Pools with shuffled block tables and NaN in every slot no sequence owns (past each length, and the
    blocks of nobody), so a read outside a row's context poisons its output."""
    lengths = [c + p for c, p in zip(chunks, prefixes)]
    _, k_cache, v_cache, tables, lens = random_pool(batch=len(chunks), heads=heads, kv_heads=kv_heads,
                                                    head_dim=head_dim, block_size=block_size, seq_lens=lengths, seed=seed)
    owned = torch.zeros(k_cache.shape[1] * block_size, dtype=torch.bool)
    for s, length in enumerate(lengths):
        for position in range(length):
            owned[int(tables[s, position // block_size]) * block_size + position % block_size] = True
    for cache in (k_cache, v_cache):
        cache.view(cache.shape[0], -1, head_dim)[:, ~owned] = float("nan")
    q = torch.randn(sum(chunks), heads, head_dim, generator=torch.Generator().manual_seed(seed + 1))
    starts = torch.tensor([0, *torch.tensor(chunks).cumsum(0).tolist()])
    return q, k_cache, v_cache, tables.long(), starts, lens.long()


def rel_err(out: torch.Tensor, exact: torch.Tensor) -> float:
    return float((out.double() - exact).norm() / exact.norm())


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (9, 3), (12, 2), (16, 2)])  # GQA ratios 1, 3, 6 and 8
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("threads", [1, 2])
def test_matches_the_fp64_reference(ops, heads, kv_heads, head_dim, threads):
    q, k_cache, v_cache, tables, starts, lens = chunked_inputs(heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    out = torch.full_like(q, float("nan"))  # poisoned: an element the kernel does not write fails
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        ops.paged_attention(q, k_cache, v_cache, tables, starts, lens, head_dim**-0.5, out=out)
    finally:
        torch.set_num_threads(before)
    exact = paged_attention_ref(q, k_cache, v_cache, tables, starts, lens, head_dim**-0.5)
    assert out.isfinite().all()
    assert rel_err(out, exact) < 1e-6
    for s in range(len(lens)):  # each sequence on its own: no chunk hides another's error
        rows = slice(int(starts[s]), int(starts[s + 1]))
        assert rel_err(out[rows], exact[rows]) < 1e-6, f"sequence {s}"


def test_sharp_scores_and_strided_query_rows(ops):
    """Scores in the hundreds (the online softmax rescales often), q as the model passes it: the query heads of
    a fused qkv row, rows further apart than heads * head_dim."""
    q, k_cache, v_cache, tables, starts, lens = chunked_inputs(heads=6, kv_heads=2, head_dim=64, seed=3)
    qkv = torch.cat([q * 40, torch.randn(len(q), 4, 64)], dim=1)
    out = ops.paged_attention(qkv[:, :6], k_cache, v_cache, tables, starts, lens, 1.0)
    exact = paged_attention_ref(q * 40, k_cache, v_cache, tables, starts, lens, 1.0)
    assert out.isfinite().all() and rel_err(out, exact) < 1e-5


@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.float16])
def test_a_row_is_the_same_bits_as_a_decode_row_alone_or_in_another_chunking(ops, pool_dtype):
    q, k_cache, v_cache, tables, starts, lens = chunked_inputs(heads=9, kv_heads=3, head_dim=64)
    k_cache, v_cache = k_cache.to(pool_dtype), v_cache.to(pool_dtype)
    out = ops.paged_attention(q, k_cache, v_cache, tables, starts, lens, 0.125)
    for s in range(len(lens)):
        first, end, length = int(starts[s]), int(starts[s + 1]), int(lens[s])
        row_lens = torch.arange(length - (end - first) + 1, length + 1)
        decoded = ops.paged_decode(q[first:end], k_cache, v_cache, tables[s].expand(end - first, -1).contiguous(),
                                   row_lens, 0.125)
        assert torch.equal(decoded, out[first:end]), f"sequence {s}: as decode rows"
        cut = (end - first) // 3  # the same rows as two chunks, the first ending mid-block
        if cut:
            pieces = torch.tensor([0, cut, end - first])
            again = ops.paged_attention(q[first:end], k_cache, v_cache, tables[s].expand(2, -1).contiguous(), pieces,
                                        torch.tensor([length - (end - first) + cut, length]), 0.125)
            assert torch.equal(again, out[first:end]), f"sequence {s}: in two chunks"


@pytest.mark.parametrize("heads,kv_heads", [(9, 3), (16, 2), (5, 5)])
def test_a_row_is_the_same_bits_whichever_rows_share_its_vectors(ops, heads, kv_heads):
    """A tile's softmax runs a vector of queries at once and its scores two queries a K load: where a chunk starts
    moves a row's queries to other lanes and partners (and an odd count scores its last query alone), never its bits."""
    q, k_cache, v_cache, tables, _, lens = chunked_inputs(heads=heads, kv_heads=kv_heads, head_dim=64, chunks=[150],
                                                          prefixes=[21], seed=5)
    whole = ops.paged_attention(q, k_cache, v_cache, tables, torch.tensor([0, 150]), lens, 0.125)
    for cut in (1, 3, 7, 8, 9, 40, 149):
        pieces = torch.tensor([0, cut, 150])
        split = ops.paged_attention(q, k_cache, v_cache, tables.expand(2, -1).contiguous(), pieces,
                                    torch.tensor([21 + cut, 171]), 0.125)
        assert torch.equal(split, whole), f"cut at {cut}"


@pytest.mark.parametrize("change,message", [
    (lambda a: {**a, "context_lens": a["context_lens"].clamp(max=10)}, "no more than its length"),
    (lambda a: {**a, "query_starts": a["query_starts"][:-1]}, r"\[sequences \+ 1\]"),
    (lambda a: {**a, "query_starts": a["query_starts"] - 1}, "must cover"),
    (lambda a: {**a, "out": torch.empty(3, 4)}, "shaped like q"),
])
def test_bad_inputs_are_refused(ops, change, message):
    q, k_cache, v_cache, tables, starts, lens = chunked_inputs(heads=4, kv_heads=2, head_dim=64)
    args = change(dict(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=tables, query_starts=starts,
                       context_lens=lens, out=None))
    with pytest.raises(RuntimeError, match=message):
        ops.paged_attention(**args, scale=0.25)
