"""The Triton chunked gated delta rule (kernels/delta_rule.py) against its torch specification
(kernels/delta_rule_ref.py), which tests/models/test_families.py holds to HF transformers and llama.cpp on the tiny
Qwen3.5; in Triton's interpreter here, on CUDA where there is one."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inferplug.kernels.delta_rule_ref import chunked_delta_rule as reference

from inferplug.kernels.delta_rule import chunked_delta_rule  # imports triton: conftest set the interpreter first
from tests.kernels.kernel_checks import relative_error


def _inputs(n, heads=2, key_dim=16, value_dim=16, device="cpu", seed=0):
    """As Gated DeltaNet makes them: q and k L2-normed (q over sqrt(key dim)), g <= 0, beta in (0, 1), a state."""
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(n, heads, key_dim, generator=gen), dim=-1) * key_dim**-0.5
    k = F.normalize(torch.randn(n, heads, key_dim, generator=gen), dim=-1)
    v = torch.randn(n, heads, value_dim, generator=gen)
    g = -F.softplus(torch.randn(n, heads, generator=gen)) * 0.3
    beta = torch.sigmoid(torch.randn(n, heads, generator=gen))
    state = torch.randn(heads, key_dim, value_dim, generator=gen) * 0.1
    return [t.to(device) for t in (q, k, v, g, beta, state)]


@pytest.mark.parametrize("n", [1, 64, 150])  # a lone row, one whole chunk, two chunks and a padded third
def test_kernel_matches_the_specification(n):
    inputs = _inputs(n)
    out, state = chunked_delta_rule(*inputs)
    expected_out, expected_state = reference(*(t.double() for t in inputs))
    assert relative_error(out, expected_out) < 1e-5
    assert relative_error(state, expected_state) < 1e-5


def test_value_blocks_split_the_state_alike():
    """Value dims wider than a program's block (48: two blocks, the second half masked), key dims not a power of
    two (24): each program carries its own slice of S."""
    inputs = _inputs(70, heads=3, key_dim=24, value_dim=48, seed=1)
    out, state = chunked_delta_rule(*inputs)
    expected_out, expected_state = reference(*(t.double() for t in inputs))
    assert relative_error(out, expected_out) < 1e-5 and relative_error(state, expected_state) < 1e-5


def test_the_callers_state_is_left_as_it_was():
    inputs = _inputs(20)
    before = inputs[-1].clone()
    chunked_delta_rule(*inputs)
    assert torch.equal(inputs[-1], before)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_at_qwen35_9b_shapes():
    """32 value heads of 128 (q/k repeated to them), a 2k-token prompt."""
    inputs = _inputs(2048, heads=32, key_dim=128, value_dim=128, device="cuda")
    out, state = chunked_delta_rule(*inputs)
    expected_out, expected_state = reference(*(t.double() for t in inputs))
    assert relative_error(out, expected_out) < 1e-4 and relative_error(state, expected_state) < 1e-4
