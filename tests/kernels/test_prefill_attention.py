"""The Triton paged prefill kernel against its pure-torch reference in fp64: fresh prompts, chunks over a
cached prefix and prefix hits, packed with cu_seqlens, through scrambled block tables, with outputs poisoned
so a row the kernel never writes fails. bf16 runs on CUDA only (the interpreter's bf16 tl.dot is wrong)."""

from __future__ import annotations

import pytest
import torch

from inferplug.kernels.prefill_attention_ref import prefill_attention_ref, random_prefill

from inferplug.kernels.prefill_attention import prefill_attention  # imports triton; conftest set the interpreter first
from tests.kernels.kernel_checks import relative_error

# (cached prefix, new tokens): lengths 1, 15, 16, 17 and a few hundred, chunks that start and end inside a block
# and on its boundary, and a one-token chunk over a long prefix (a prefix hit that leaves one token to compute).
CHUNKS = [(0, 1), (0, 15), (0, 16), (0, 17), (16, 16), (5, 27), (280, 1), (0, 300)]


def _check(chunks, heads, kv_heads, head_dim, block_size, dtype=torch.float32, device="cpu", **knobs) -> float:
    q, k_cache, v_cache, cu, lens, tables = random_prefill(chunks=chunks, heads=heads, kv_heads=kv_heads,
                                                           head_dim=head_dim, block_size=block_size, dtype=dtype,
                                                           device=device)  # fmt: skip
    scale = head_dim**-0.5
    expected = prefill_attention_ref(q.double(), k_cache.double(), v_cache.double(), cu, lens, tables, scale)
    got = prefill_attention(q, k_cache, v_cache, cu, lens, tables, scale, **knobs)
    return relative_error(got, expected)


@pytest.mark.parametrize(
    "heads,kv_heads,head_dim,block_size",
    [(2, 2, 64, 16), (3, 1, 128, 16), (8, 1, 64, 4)],  # GQA 1, 3 and 8; head_dim 64 and 128; small blocks
)
def test_prefill_matches_an_fp64_reference(poisoned_buffers, heads, kv_heads, head_dim, block_size):
    assert _check(CHUNKS, heads, kv_heads, head_dim, block_size) < 1e-6  # fp32 in, fp32 ("ieee") dots


def test_small_tiles_and_fp16(poisoned_buffers):
    assert _check(CHUNKS[:6], 4, 2, 64, 16, block_m=16, block_n=32) < 1e-6
    # fp16 output and fp16 softmax weights in the P @ V product: 2^-11 relative each
    assert _check(CHUNKS[:6], 4, 2, 64, 16, dtype=torch.float16) < 2e-3


def test_a_chunk_gets_the_same_bits_alone_and_packed():
    q, k_cache, v_cache, cu, lens, tables = random_prefill(chunks=CHUNKS[:6], heads=4, kv_heads=2, head_dim=16,
                                                           block_size=4)  # fmt: skip
    packed = prefill_attention(q, k_cache, v_cache, cu, lens, tables, 0.25)
    i = 5
    rows = slice(int(cu[i]), int(cu[i + 1]))
    alone = prefill_attention(q[rows], k_cache, v_cache, cu[i:i + 2] - cu[i], lens[i:i + 1], tables[i:i + 1], 0.25)
    assert torch.equal(alone, packed[rows])


def test_reference_matches_sdpa_on_a_fresh_prompt():
    q, k_cache, v_cache, cu, lens, tables = random_prefill(chunks=[(0, 20)], heads=4, kv_heads=2, head_dim=16, block_size=4)
    keys = k_cache[:, tables[0].long()].reshape(2, -1, 16)[:, :20]
    values = v_cache[:, tables[0].long()].reshape(2, -1, 16)[:, :20]
    sdpa = torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1), keys, values, is_causal=True,
                                                            enable_gqa=True)  # fmt: skip
    torch.testing.assert_close(prefill_attention_ref(q, k_cache, v_cache, cu, lens, tables, 0.25), sdpa.transpose(0, 1))


def test_bad_shapes_are_refused():
    q, k_cache, v_cache, cu, lens, tables = random_prefill(chunks=[(0, 4)], heads=3, kv_heads=2, head_dim=8, block_size=4)
    with pytest.raises(ValueError, match="split evenly"):
        prefill_attention(q, k_cache, v_cache, cu, lens, tables, 1.0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_prefill_on_cuda_at_7b_shapes_in_bf16(poisoned_buffers):
    chunks = CHUNKS + [(1000, 512), (0, 2048)]
    assert _check(chunks, 32, 8, 128, 16, dtype=torch.bfloat16, device="cuda") < 1e-2
