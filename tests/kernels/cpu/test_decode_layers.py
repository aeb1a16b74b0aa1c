"""decode_layers (kernels/cpu/decode_layers.cpp) with GPTQ act-order weights: inputs gathered in the call, bit for
bit what the layer-by-layer path computes with index_select before each matmul (PermutedLinear), on fp32 and fp16
K/V pools."""

from __future__ import annotations

import pytest
import torch

from inferplug.models.config import ModelConfig
from inferplug.models.rope import rope_tables
from inferplug.quant.block_linear import Q4G128Linear, Q4Linear, Q8Linear
from inferplug.quant.kquant_linear import Q4KLinear, Q5_0Linear, Q5KLinear, Q6KLinear

HEADS, KV_HEADS, HEAD_DIM, HIDDEN, INTER, LAYERS = 4, 2, 32, 256, 96, 2
BLOCKS, BLOCK_SIZE, EPS = 8, 16, 1e-5


def model(seed: int, act_order: bool):
    """Per layer: 2 norms, and (qkv, a second qkv part, o, gate_up, down) as (blocks, kind, input order): Q8_0, Q4_K
    (where the inputs are whole super-blocks of 256; Q5_K for layer 1's gate_up), Q4_G128 (whole groups of 128) and Q4_1
    in turn, layer 0's down Q5_0. Layer 0's qkv is q/k rows in one format and the v rows in Q6_K (a Q4_K_M's layer); layer 1's has no second
    part (kind 0)."""
    gen = torch.Generator().manual_seed(seed)
    qkv_rows = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    split = (HEADS + KV_HEADS) * HEAD_DIM
    norms, weights = [], []
    for layer in range(LAYERS):
        shapes = [(split if layer == 0 else qkv_rows, HIDDEN), (qkv_rows - split if layer == 0 else 0, HIDDEN),
                  (HIDDEN, HEADS * HEAD_DIM), (2 * INTER, HIDDEN), (HIDDEN, INTER)]
        norms += [1 + 0.1 * torch.randn(HIDDEN, generator=gen) for _ in range(2)]
        qkv_order = torch.randperm(HIDDEN, generator=gen) if act_order else torch.empty(0, dtype=torch.long)
        for i, (n, k) in enumerate(shapes):
            cls, kind = ((Q6KLinear, 7) if i == 1 else (Q5_0Linear, 10) if (layer, i) == (0, 4)
                         else (Q8Linear, 8) if (layer + i) % 4 == 3 else (Q4KLinear, 5) if k % 256 == 0 and (layer + i) % 2
                         else (Q5KLinear, 9) if k % 256 == 0 and layer
                         else (Q4G128Linear, 6) if k % 128 == 0 else (Q4Linear, 4))
            order = qkv_order if i < 2 else torch.randperm(k, generator=gen) if act_order else torch.empty(0, dtype=torch.long)
            if n == 0:
                weights.append((torch.empty(0, dtype=torch.uint8), 0, order))
                continue
            weights.append((cls.from_float(0.1 * torch.randn(n, k, generator=gen)).blocks, kind, order))
    return norms, weights


def layer_by_layer(ops, x, norms, weights, k_caches, v_caches, args):
    """DecoderModel.forward's kernel calls, one by one, an act-order weight's input gathered by index_select."""
    positions, cos, signed_sin, slots, tables, lengths = args

    def linear(h, w):
        blocks, kind, order = w
        h = h.index_select(1, order) if order.numel() else h
        return {4: ops.q4_matmul, 5: ops.q4_k_matmul, 6: ops.q4_g128_matmul, 7: ops.q6_k_matmul, 8: ops.q8_matmul,
                9: ops.q5_k_matmul, 10: ops.q5_0_matmul}[kind](h, blocks)

    delta = None
    for i in range(LAYERS):
        h = ops.rms_norm(x, norms[2 * i], EPS) if delta is None else ops.add_rms_norm_(x, delta, norms[2 * i], EPS)
        qkv = linear(h, weights[5 * i])
        if weights[5 * i + 1][1]:
            qkv = torch.cat([qkv, linear(h, weights[5 * i + 1])], dim=1)
        ops.rope_write_kv_(qkv, positions, cos, signed_sin, k_caches[i], v_caches[i], slots, HEADS)
        q = qkv.view(len(x), -1, HEAD_DIM)[:, :HEADS]
        attn = ops.paged_decode(q, k_caches[i], v_caches[i], tables, lengths, HEAD_DIM**-0.5).view(len(x), -1)
        h = ops.add_rms_norm_(x, linear(attn, weights[5 * i + 2]), norms[2 * i + 1], EPS)
        delta = linear(ops.silu_mul(linear(h, weights[5 * i + 3])), weights[5 * i + 4])
    return x.add_(delta)


def step_inputs(tokens: int):
    """One decode row per sequence: sequence r at position 5 + 3r, its block table's blocks 2r, 2r + 1."""
    config = ModelConfig(architecture="llama", vocab_size=10, hidden_size=HIDDEN, intermediate_size=INTER,
                         num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                         head_dim=HEAD_DIM, max_position_embeddings=64, rope_theta=10000.0)
    cos, signed_sin = rope_tables(config, torch.device("cpu"))
    positions = torch.arange(tokens) * 3 + 5
    tables = torch.arange(2 * tokens).view(tokens, 2)
    return positions, cos, signed_sin, tables[:, 0] * BLOCK_SIZE + positions, tables, positions + 1


def pools(seed: int, tokens: int, dtype=torch.float32):
    """Every layer's K/V pools, holding random keys and values before each sequence's new token."""
    gen = torch.Generator().manual_seed(seed)
    shape = (KV_HEADS, 2 * tokens, BLOCK_SIZE, HEAD_DIM)
    return ([torch.randn(shape, generator=gen).to(dtype) for _ in range(LAYERS)],
            [torch.randn(shape, generator=gen).to(dtype) for _ in range(LAYERS)])


@pytest.mark.parametrize("tokens", [1, 3])
@pytest.mark.parametrize("act_order", [True, False])
@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.float16])
def test_decode_layers_gathers_act_order_inputs_like_index_select(ops, tokens, act_order, pool_dtype):
    norms, weights = model(tokens, act_order)
    args = step_inputs(tokens)
    x = torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(7))
    k_ref, v_ref = pools(1, tokens, pool_dtype)
    expected = layer_by_layer(ops, x.clone(), norms, weights, k_ref, v_ref, args)
    k_caches, v_caches = pools(1, tokens, pool_dtype)
    blocks, kinds, orders = (list(field) for field in zip(*weights))
    ops.decode_layers(x, norms, blocks, kinds, orders, k_caches, v_caches, *args, HEADS, HEAD_DIM**-0.5, EPS, [], [], [], [], [], [], [])
    assert torch.equal(x, expected)
    assert all(torch.equal(a, b) for a, b in zip(k_caches + v_caches, k_ref + v_ref))


def test_decode_layers_refuses_an_order_outside_the_inputs(ops):
    norms, weights = model(0, True)
    blocks, kinds, orders = (list(field) for field in zip(*weights))
    orders[2] = orders[2].clone()
    orders[2][5] = HEADS * HEAD_DIM  # o_proj's
    k_caches, v_caches = pools(1, 1)
    with pytest.raises(RuntimeError, match="outside 0..127"):
        ops.decode_layers(torch.randn(1, HIDDEN), norms, blocks, kinds, orders, k_caches, v_caches, *step_inputs(1),
                          HEADS, HEAD_DIM**-0.5, EPS, [], [], [], [], [], [], [])
