"""The Triton attention kernels with a sliding window (Gemma 3's local layers) against the fp64 reference
(paged_attention_ref, which the C++ kernel meets too): decode, split-K or not, and prefill chunks over cached
prefixes, in Triton's interpreter here and on CUDA where there is one."""

from __future__ import annotations

import pytest
import torch

from inferplug.kernels.paged_attention_ref import paged_attention_ref, random_pool
from inferplug.kernels.prefill_attention_ref import random_prefill

from inferplug.kernels.paged_attention import paged_attention_decode  # imports triton: conftest set the interpreter
from inferplug.kernels.prefill_attention import prefill_attention
from tests.kernels.kernel_checks import relative_error
from tests.kernels.test_prefill_attention import CHUNKS

WINDOWS = [1, 7, 64, 100, 10_000]  # inside a tile, one tile, between tiles, longer than every context


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("knobs", [dict(split_k=False), dict(partition_size=64)], ids=["single_pass", "split_64"])
def test_decode_with_a_window(window, knobs):
    seq_lens = [1, 63, 64, 65, 130, 300]
    q, k_cache, v_cache, tables, lens = random_pool(batch=len(seq_lens), heads=4, kv_heads=2, head_dim=16,
                                                    block_size=4, seq_lens=seq_lens)
    got = paged_attention_decode(q, k_cache, v_cache, tables, lens, 0.25, window=window, **knobs)
    starts = torch.arange(len(seq_lens) + 1)
    expected = paged_attention_ref(q, k_cache, v_cache, tables.long(), starts, lens.long(), 0.25, window=window)
    assert relative_error(got, expected) < 1e-6


@pytest.mark.parametrize("window", WINDOWS)
def test_prefill_with_a_window(poisoned_buffers, window):
    q, k_cache, v_cache, cu, lens, tables = random_prefill(chunks=CHUNKS, heads=3, kv_heads=1, head_dim=32,
                                                           block_size=16)
    got = prefill_attention(q, k_cache, v_cache, cu, lens, tables, 0.125, window=window, block_m=16, block_n=32)
    expected = paged_attention_ref(q, k_cache, v_cache, tables.long(), cu.long(), lens.long(), 0.125, window=window)
    assert relative_error(got, expected) < 1e-6


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_windows_on_cuda_at_gemma3_shapes_in_bf16(poisoned_buffers):
    """Gemma 3 4B's local layers: 8 heads, 4 KV heads of 256, a 1024-token window."""
    chunks = CHUNKS + [(1000, 512), (0, 2048)]
    q, k_cache, v_cache, cu, lens, tables = random_prefill(chunks=chunks, heads=8, kv_heads=4, head_dim=256,
                                                           block_size=16, dtype=torch.bfloat16, device="cuda")
    got = prefill_attention(q, k_cache, v_cache, cu, lens, tables, 256**-0.5, window=1024)
    expected = paged_attention_ref(q.cpu(), k_cache.cpu(), v_cache.cpu(), tables.long().cpu(), cu.long().cpu(),
                                   lens.long().cpu(), 256**-0.5, window=1024)
    assert relative_error(got.cpu(), expected) < 1e-2


@pytest.mark.parametrize("window", [5, 40])
def test_a_windowed_chunk_gets_the_same_bits_alone_and_packed(window):
    """The kernel's invariance (test_prefill_attention.py's) with a window: a chunk's rows do not depend on what is
    packed with it, though its later rows see key tiles wholly before their windows (those add exactly nothing)."""
    q, k_cache, v_cache, cu, lens, tables = random_prefill(chunks=CHUNKS[:6] + [(100, 40)], heads=4, kv_heads=2,
                                                           head_dim=16, block_size=4)
    packed = prefill_attention(q, k_cache, v_cache, cu, lens, tables, 0.25, window=window, block_m=16, block_n=16)
    for i in (5, 6):
        rows = slice(int(cu[i]), int(cu[i + 1]))
        alone = prefill_attention(q[rows], k_cache, v_cache, cu[i:i + 2] - cu[i], lens[i:i + 1], tables[i:i + 1],
                                  0.25, window=window, block_m=16, block_n=16)
        assert torch.equal(alone, packed[rows]), f"chunk {i}"
        assert alone.isfinite().all()
