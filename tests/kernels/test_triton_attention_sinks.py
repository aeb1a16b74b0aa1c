"""The Triton attention kernels with attention sinks (gpt-oss) against the fp64 reference (paged_attention_ref, which
the C++ kernel and the torch path meet too): decode in one pass and split into partitions (the sink joins the merged
denominator once), and prefill chunks over cached prefixes, with and without a window; Triton's interpreter here."""

from __future__ import annotations

import pytest
import torch

from inferplug.kernels.paged_attention_ref import paged_attention_ref, random_pool
from inferplug.kernels.prefill_attention_ref import random_prefill

from inferplug.kernels.paged_attention import paged_attention_decode  # imports triton: conftest set the interpreter
from inferplug.kernels.prefill_attention import prefill_attention
from tests.kernels.kernel_checks import relative_error
from tests.kernels.test_prefill_attention import CHUNKS

SINKS = torch.tensor([-2.0, 0.5, 3.0, 30.0])  # 30 outweighs every key: the merge must not overflow


@pytest.mark.parametrize("window", [0, 7])
@pytest.mark.parametrize("knobs", [dict(split_k=False), dict(partition_size=64)], ids=["single_pass", "split_64"])
def test_decode_with_sinks(window, knobs):
    seq_lens = [1, 63, 65, 130, 300]
    q, k_cache, v_cache, tables, lens = random_pool(batch=len(seq_lens), heads=4, kv_heads=2, head_dim=16,
                                                    block_size=4, seq_lens=seq_lens)
    got = paged_attention_decode(q, k_cache, v_cache, tables, lens, 0.25, window=window, sinks=SINKS, **knobs)
    starts = torch.arange(len(seq_lens) + 1)
    expected = paged_attention_ref(q, k_cache, v_cache, tables.long(), starts, lens.long(), 0.25, window=window,
                                   sinks=SINKS)
    assert relative_error(got, expected) < 1e-6


@pytest.mark.parametrize("window", [0, 40])
def test_prefill_with_sinks(poisoned_buffers, window):
    q, k_cache, v_cache, cu, lens, tables = random_prefill(chunks=CHUNKS, heads=4, kv_heads=1, head_dim=32,
                                                           block_size=16)
    got = prefill_attention(q, k_cache, v_cache, cu, lens, tables, 0.125, window=window, sinks=SINKS, block_m=16,
                            block_n=32)
    expected = paged_attention_ref(q, k_cache, v_cache, tables.long(), cu.long(), lens.long(), 0.125, window=window,
                                   sinks=SINKS)
    assert relative_error(got, expected) < 1e-6
