"""The gated delta rule's decode step (kernels/cpu/delta_rule.cpp) against HF transformers' own recurrence
(torch_recurrent_gated_delta_rule, the reference its Qwen3.5 runs), in place on the rows' state slots; and a row's
bits alone and in a batch."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3_5.modeling_qwen3_5 import torch_recurrent_gated_delta_rule

HEADS, KEY_DIM, VALUE_DIM, SLOTS = 4, 32, 48, 6


def inputs(rows: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    pool = torch.randn(SLOTS, HEADS, KEY_DIM, VALUE_DIM, generator=gen) * 0.3
    q, k = (torch.nn.functional.normalize(torch.randn(rows, HEADS, KEY_DIM, generator=gen), dim=-1) for _ in "qk")
    v = torch.randn(rows, HEADS, VALUE_DIM, generator=gen)
    g, beta = -torch.rand(rows, HEADS, generator=gen) * 2, torch.rand(rows, HEADS, generator=gen)
    return pool, q * KEY_DIM**-0.5, k, v, g, beta


def test_a_step_matches_hfs_recurrence(ops):
    pool, q, k, v, g, beta = inputs(3, 0)
    slots = torch.tensor([4, 0, 2])
    before = pool.clone()
    out = ops.delta_rule_step_(pool, slots, q, k, v, g, beta)
    # HF takes q unscaled (it scales by 1 / sqrt(key dim) itself) and [B, T, heads, dim]
    ref_out, ref_state = torch_recurrent_gated_delta_rule(
        (q * KEY_DIM**0.5).unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), g.unsqueeze(1), beta.unsqueeze(1),
        initial_state=before[slots], output_final_state=True)
    torch.testing.assert_close(out, ref_out.squeeze(1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pool[slots], ref_state, rtol=1e-5, atol=1e-5)
    untouched = [s for s in range(SLOTS) if s not in slots.tolist()]
    assert torch.equal(pool[untouched], before[untouched])


def test_a_rows_bits_do_not_depend_on_its_batch(ops):
    pool, q, k, v, g, beta = inputs(5, 1)
    slots = torch.tensor([1, 3, 5, 0, 2])
    together, alone = pool.clone(), pool.clone()
    out = ops.delta_rule_step_(together, slots, q, k, v, g, beta)
    for r in range(5):
        one = ops.delta_rule_step_(alone, slots[r:r + 1], q[r:r + 1], k[r:r + 1], v[r:r + 1], g[r:r + 1],
                                   beta[r:r + 1])
        assert torch.equal(one[0], out[r])
    assert torch.equal(alone, together)


def test_bad_inputs_are_clear_errors(ops):
    pool, q, k, v, g, beta = inputs(2, 2)
    with pytest.raises(RuntimeError, match="slot is out of range"):
        ops.delta_rule_step_(pool, torch.tensor([0, SLOTS]), q, k, v, g, beta)
    with pytest.raises(RuntimeError, match="shapes do not match"):
        ops.delta_rule_step_(pool, torch.tensor([0, 1]), q, k, v[:, :, :8].contiguous(), g, beta)
