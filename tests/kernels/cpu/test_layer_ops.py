"""The fused layer ops (kernels/cpu/layer_ops.cpp) against the torch path they replace in models/decoder.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inferplug.models.config import ModelConfig
from inferplug.models.rope import rope_tables
from inferplug.ops.attention import write_kv
from inferplug.ops.torch_ops import apply_rope

HEADS, KV_HEADS, HEAD_DIM, BLOCKS, BLOCK_SIZE = 9, 3, 64, 12, 16


def pools(dtype=torch.float32):
    shape = (KV_HEADS, BLOCKS, BLOCK_SIZE, HEAD_DIM)
    return torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)


def tables():
    config = ModelConfig(architecture="llama", vocab_size=10, hidden_size=HEADS * HEAD_DIM, intermediate_size=8,
                         num_hidden_layers=1, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                         max_position_embeddings=512, rope_theta=10000.0)
    return rope_tables(config, torch.device("cpu"))


@pytest.mark.parametrize("tokens", [1, 3, 40])
@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.float16])
def test_rope_write_kv_equals_the_torch_path_bit_for_bit(ops, tokens, pool_dtype):
    """HF's rounding: x * cos + rotate_half(x) * sin as two products and a sum (torch's addcmul in apply_rope
    fuses one product into the sum, so it can differ in the last bit). fp16 pools store what write_kv's cast does."""
    cos, signed_sin = tables()
    gen = torch.Generator().manual_seed(tokens)
    qkv = torch.randn(tokens, (HEADS + 2 * KV_HEADS) * HEAD_DIM, generator=gen)
    positions = torch.randint(0, 512, (tokens,), generator=gen)
    slots = torch.randperm(BLOCKS * BLOCK_SIZE, generator=gen)[:tokens]

    heads = qkv.clone().view(tokens, -1, HEAD_DIM)
    x = heads[:, : HEADS + KV_HEADS]
    rotated = x * cos[positions, None] + x.roll(HEAD_DIM // 2, dims=-1) * signed_sin[positions, None]  # HF's ops
    torch.testing.assert_close(rotated, apply_rope(x, cos[positions, None], signed_sin[positions, None]))
    k_ref, v_ref = pools(pool_dtype)
    write_kv(k_ref, v_ref, rotated[:, HEADS:], heads[:, HEADS + KV_HEADS:], slots)

    k_cache, v_cache = pools(pool_dtype)
    ops.rope_write_kv_(qkv, positions, cos, signed_sin, k_cache, v_cache, slots, HEADS)
    assert torch.equal(qkv.view(tokens, -1, HEAD_DIM)[:, : HEADS + KV_HEADS], rotated)
    assert torch.equal(qkv.view(tokens, -1, HEAD_DIM)[:, HEADS + KV_HEADS:], heads[:, HEADS + KV_HEADS:])
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)


def test_rope_write_kv_refuses_indices_outside_the_pool_or_table(ops):
    cos, signed_sin = tables()
    qkv = torch.randn(1, (HEADS + 2 * KV_HEADS) * HEAD_DIM)
    k_cache, v_cache = pools()
    with pytest.raises(RuntimeError, match="outside the pool"):
        ops.rope_write_kv_(qkv, torch.tensor([0]), cos, signed_sin, k_cache, v_cache, torch.tensor([BLOCKS * BLOCK_SIZE]), HEADS)
    with pytest.raises(RuntimeError, match="outside the RoPE table"):
        ops.rope_write_kv_(qkv, torch.tensor([512]), cos, signed_sin, k_cache, v_cache, torch.tensor([0]), HEADS)
    with pytest.raises(RuntimeError, match="must be \\[tokens"):
        ops.rope_write_kv_(qkv, torch.tensor([0]), cos, signed_sin, k_cache, v_cache, torch.tensor([0]), HEADS + 1)
    assert not k_cache.any() and not v_cache.any(), "a refused call writes nothing"


@pytest.mark.parametrize(("tokens", "width"), [(1, 1536), (5, 20), (33, 100)])  # 20, 100: a tail past the 8-lane vectors
def test_silu_mul_matches_torch(ops, tokens, width):
    gate_up = torch.randn(tokens, 2 * width) * 30  # far into both tails of the sigmoid
    gate_up[0, :4] = torch.tensor([0.0, -0.0, 100.0, -100.0])
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(ops.silu_mul(gate_up), F.silu(gate) * up, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("experts", "hidden"), [(128, 2048), (6, 40), (32, 2880)])  # 6, 40: tails past 4 experts, 16 lanes
def test_router_logits_match_a_float64_product(ops, experts, hidden):
    x, router = torch.randn(9, hidden), torch.randn(experts, hidden) / hidden**0.5
    want = (x.double() @ router.double().T).float()
    torch.testing.assert_close(ops.router_logits(x, router), want, rtol=1e-5, atol=1e-5)


def test_a_router_logit_does_not_depend_on_the_rows_beside_it(ops):
    """Each row's logits, alone and among 37 others, in the same bits: the experts a row takes follow from them."""
    x, router = torch.randn(37, 2048), torch.randn(128, 2048)
    together = ops.router_logits(x, router)
    assert torch.equal(together, torch.cat([ops.router_logits(x[i:i + 1], router) for i in range(37)]))
    assert torch.equal(together[5:], ops.router_logits(x[5:], router))


def test_router_logits_refuse_mismatched_widths(ops):
    with pytest.raises(RuntimeError, match="router \\[experts, hidden\\]"):
        ops.router_logits(torch.randn(2, 64), torch.randn(8, 32))
