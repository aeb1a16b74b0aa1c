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
