"""The fused RMSNorm ops against torch's rms_norm."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F


@pytest.mark.parametrize("rows", [1, 5, 40])
def test_rms_norm_matches_torch(ops, rows):
    x, weight = torch.randn(rows, 576), torch.randn(576)
    torch.testing.assert_close(ops.rms_norm(x, weight, 1e-5), F.rms_norm(x, (576,), weight, 1e-5))


def test_add_rms_norm_adds_in_place_then_normalizes(ops):
    x, delta, weight = torch.randn(3, 576), torch.randn(3, 576), torch.randn(576)
    expected_sum = x + delta
    out = ops.add_rms_norm_(x, delta, weight, 1e-6)
    torch.testing.assert_close(x, expected_sum)
    torch.testing.assert_close(out, F.rms_norm(expected_sum, (576,), weight, 1e-6))


def test_bad_inputs_are_clear_errors(ops):
    with pytest.raises(RuntimeError, match="last dim must match"):
        ops.rms_norm(torch.randn(2, 8), torch.randn(4), 1e-5)
    with pytest.raises(RuntimeError, match="float32"):
        ops.rms_norm(torch.randn(2, 4, dtype=torch.float64), torch.randn(4), 1e-5)


@pytest.mark.parametrize("kv_heads", [4, 0])  # q and k, or q alone (a layer reading another's KV)
def test_qk_norm_in_place_is_torch_rms_norm_on_each_head(ops, kv_heads):
    heads, dim = 8, 64
    qkv = torch.randn(5, (heads + 2 * kv_heads) * dim)
    q_norm, k_norm = torch.randn(dim), torch.randn(dim)
    expected = qkv.clone().view(5, -1, dim)
    expected[:, :heads] = F.rms_norm(expected[:, :heads], (dim,), q_norm, 1e-6)
    expected[:, heads:heads + kv_heads] = F.rms_norm(expected[:, heads:heads + kv_heads], (dim,), k_norm, 1e-6)
    ops.qk_rms_norm_(qkv, q_norm, k_norm if kv_heads else None, heads, kv_heads, 1e-6)
    torch.testing.assert_close(qkv.view(5, -1, dim), expected)  # v's heads untouched, exactly
    assert torch.equal(qkv.view(5, -1, dim)[:, heads + kv_heads:], expected[:, heads + kv_heads:])


def test_qk_norm_is_the_bits_of_rms_norm_on_the_heads_copied_out(ops):
    """The layer-by-layer path (this op) and decode_layers (rms_norm on each part's copy) norm a head alike."""
    qkv, q_norm, k_norm = torch.randn(3, 12 * 128), torch.randn(128), torch.randn(128)
    heads = qkv.view(3, -1, 128)
    copied = [ops.rms_norm(heads[:, a:b].reshape(-1, 128).contiguous(), w, 1e-6) for a, b, w in
              ((0, 8, q_norm), (8, 10, k_norm))]
    ops.qk_rms_norm_(qkv, q_norm, k_norm, 8, 2, 1e-6)
    assert torch.equal(heads[:, :8].reshape(-1, 128), copied[0])
    assert torch.equal(heads[:, 8:10].reshape(-1, 128), copied[1])
    with pytest.raises(RuntimeError, match="k_norm given"):
        ops.qk_rms_norm_(qkv, q_norm, None, 8, 2, 1e-6)
