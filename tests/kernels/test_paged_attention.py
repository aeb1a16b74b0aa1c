"""The Triton paged-attention decode kernel against its pure-torch reference, torch's SDPA (an independent
reference, tests/sdpa_reference.py) and the engine's CPU path.

Under the interpreter the 16-bit cases use fp16: Triton 3.x's interpreter multiplies bf16 tl.dot operands as
their raw uint16 bits, so bf16 is checked on CUDA only."""

from __future__ import annotations

import pytest
import torch

from inferplug.kernels.paged_attention_ref import paged_attention_decode_ref, random_pool

from inferplug.kernels.paged_attention import paged_attention_decode  # imports triton; conftest set the interpreter first
from tests.kernels.kernel_checks import relative_error
from tests.sdpa_reference import sdpa_decode


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


# Lengths at and around block and tile (64) boundaries and a few hundred tokens; 300 is five 64-token partitions
# and two default (256) ones. Paths: one program per sequence, split-K with small partitions, the default.
PATHS = {"single_pass": dict(split_k=False), "split_64": dict(partition_size=64), "default": {}}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    "heads,kv_heads,head_dim,block_size",
    [(2, 2, 64, 16), (6, 2, 128, 16), (8, 1, 64, 16), (3, 3, 16, 4), (8, 1, 8, 32)],
)
def test_paths_write_every_element_and_match_an_fp64_reference(
    poisoned_buffers, path, heads, kv_heads, head_dim, block_size
):
    seq_lens = [1, 15, 16, 17, 64, 65, 300]
    q, k_cache, v_cache, tables, lens = random_pool(batch=len(seq_lens), heads=heads, kv_heads=kv_heads,
                                                    head_dim=head_dim, block_size=block_size, seq_lens=seq_lens)  # fmt: skip
    scale = head_dim**-0.5
    expected = paged_attention_decode_ref(q.double(), k_cache.double(), v_cache.double(), tables, lens, scale)
    got = paged_attention_decode(q, k_cache, v_cache, tables, lens, scale, **PATHS[path])
    assert relative_error(got, expected) < 1e-6  # fp32 inputs, fp32 ("ieee") dot products


@pytest.mark.parametrize("path", PATHS)
def test_fp16_paths_match_an_fp64_reference(poisoned_buffers, path):
    seq_lens = [1, 17, 300, 40]
    q, k_cache, v_cache, tables, lens = random_pool(batch=4, heads=8, kv_heads=2, head_dim=64, block_size=16,
                                                    seq_lens=seq_lens, dtype=torch.float16)  # fmt: skip
    expected = paged_attention_decode_ref(q.double(), k_cache.double(), v_cache.double(), tables, lens, 0.125)
    got = paged_attention_decode(q, k_cache, v_cache, tables, lens, 0.125, **PATHS[path])
    # fp16 output (2^-11 relative rounding) and the softmax weights cast to fp16 for the P @ V tensor-core product
    assert relative_error(got, expected) < 2e-3


def test_a_sequence_gets_the_same_bits_alone_and_in_a_batch():
    seq_lens = [300, 5, 129, 1000]
    q, k_cache, v_cache, tables, lens = random_pool(batch=4, heads=4, kv_heads=2, head_dim=16, block_size=16, seq_lens=seq_lens)
    batched = paged_attention_decode(q, k_cache, v_cache, tables, lens, 0.25)
    for b in (0, 3):
        alone = paged_attention_decode(q[b : b + 1], k_cache, v_cache, tables[b : b + 1], lens[b : b + 1], 0.25)
        assert torch.equal(alone[0], batched[b])


def test_reference_matches_the_engine_cpu_decode_path():
    from inferplug.ops.attention import PagedRows, _decode

    seq_lens = [3, 9]
    q, k_cache, v_cache, tables, lens = random_pool(batch=2, heads=4, kv_heads=2, head_dim=8, block_size=4, seq_lens=seq_lens)
    positions = torch.arange(tables.shape[1] * 4)
    bias = torch.where(positions[None, :] < lens[:, None], 0.0, float("-inf")).view(1, 2, 1, -1)
    rows = PagedRows(0, 2, tables.long(), bias)
    engine = _decode(q, k_cache, v_cache, rows, 8**-0.5)
    torch.testing.assert_close(paged_attention_decode_ref(q, k_cache, v_cache, tables, lens, 8**-0.5), engine)


def test_block_size_must_be_a_power_of_two():
    q, k_cache, v_cache, tables, lens = random_pool(batch=1, heads=2, kv_heads=1, head_dim=8, block_size=3, seq_lens=[4])
    with pytest.raises(ValueError, match="power of two"):
        paged_attention_decode(q, k_cache, v_cache, tables, lens, 1.0)


@pytest.mark.parametrize(
    "kwargs,message",
    [(dict(tile=48), "tile 48"), (dict(tile=8), "tile 8"), (dict(partition_size=100), "partition_size 100")],
)
def test_bad_knobs_are_refused(kwargs, message):
    q, k_cache, v_cache, tables, lens = random_pool(batch=1, heads=2, kv_heads=1, head_dim=8, block_size=4, seq_lens=[4])
    with pytest.raises(ValueError, match=message):
        paged_attention_decode(q, k_cache, v_cache, tables, lens, 1.0, **kwargs)


def test_heads_must_split_evenly_over_kv_heads():
    q, k_cache, v_cache, tables, lens = random_pool(batch=1, heads=3, kv_heads=2, head_dim=8, block_size=4, seq_lens=[4])
    with pytest.raises(ValueError, match="split evenly"):
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


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("path", PATHS)
def test_paths_on_cuda_at_7b_shapes_in_bf16(poisoned_buffers, path):
    seq_lens = [1, 15, 16, 17, 255, 256, 257, 3000]
    q, k_cache, v_cache, tables, lens = random_pool(batch=8, heads=32, kv_heads=8, head_dim=128, block_size=16,
                                                    seq_lens=seq_lens, device="cuda", dtype=torch.bfloat16)  # fmt: skip
    scale = 128**-0.5
    expected = paged_attention_decode_ref(q.double(), k_cache.double(), v_cache.double(), tables, lens, scale)
    got = paged_attention_decode(q, k_cache, v_cache, tables, lens, scale, **PATHS[path])
    assert relative_error(got, expected) < 1e-2  # bf16 output and bf16 softmax weights: 2^-8 relative each
    alone = paged_attention_decode(q[-1:], k_cache, v_cache, tables[-1:], lens[-1:], scale, **PATHS[path])
    assert torch.equal(alone[0], got[-1])  # batch-invariant: the same bits alone and in the batch
