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


# A DeltaNet layer's whole decode step (delta_net_step_) against the torch ops models/delta_net.py runs without it.
KEY_HEADS, VALUE_HEADS, CONV_KERNEL = 2, 4, 4


def layer_step(rows: int, seed: int):
    from inferplug.models.delta_net import DeltaNetWeights

    gen = torch.Generator().manual_seed(seed)
    channels = 2 * KEY_HEADS * KEY_DIM + VALUE_HEADS * VALUE_DIM
    w = DeltaNetWeights(qkv=None, z=None, b=None, a=None, conv=torch.randn(channels, CONV_KERNEL, generator=gen) * 0.5,
                        dt_bias=torch.randn(VALUE_HEADS, generator=gen),
                        neg_a=-torch.rand(VALUE_HEADS, generator=gen) * 8,
                        norm=1 + torch.randn(VALUE_DIM, generator=gen) * 0.1, out=None, key_heads=KEY_HEADS,
                        value_heads=VALUE_HEADS, key_dim=KEY_DIM, value_dim=VALUE_DIM,
                        key_of_value=torch.tensor([0, 1, 0, 1]))  # tiled, as llama.cpp's GGUF has them
    pools = (torch.randn(SLOTS, CONV_KERNEL - 1, channels, generator=gen),
             torch.randn(SLOTS, VALUE_HEADS, KEY_DIM, VALUE_DIM, generator=gen) * 0.3)
    step = (torch.randn(rows, channels, generator=gen), torch.randn(rows, VALUE_HEADS, generator=gen) * 2,
            torch.randn(rows, VALUE_HEADS, generator=gen) * 2,
            torch.randn(rows, VALUE_HEADS * VALUE_DIM, generator=gen))
    return w, pools, step


def torch_step(w, pools, slots, step, eps=1e-6):
    from inferplug.models.delta_net import _decode_step
    from inferplug.ops.torch_ops import TorchOps

    return _decode_step(w, pools, slots, *step, eps, TorchOps(torch.float32))


def test_the_whole_decode_step_matches_the_torch_ops(ops):
    w, pools, step = layer_step(3, 3)
    slots = torch.tensor([5, 1, 2])
    theirs = tuple(p.clone() for p in pools)
    out = ops.delta_net_step_(*pools, slots, *step, w.conv, w.dt_bias, w.neg_a, w.norm, w.key_of_value, KEY_HEADS, 1e-6)
    ref = torch_step(w, theirs, slots, step)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for ours, ref_pool in zip(pools, theirs):  # the conv windows and the states, each slot's its own
        torch.testing.assert_close(ours, ref_pool, rtol=1e-5, atol=1e-5)


def test_a_rows_decode_step_is_the_same_bits_alone_and_in_a_batch(ops):
    w, pools, step = layer_step(4, 4)
    slots = torch.tensor([2, 0, 4, 3])
    alone = tuple(p.clone() for p in pools)
    constants = (w.conv, w.dt_bias, w.neg_a, w.norm, w.key_of_value, KEY_HEADS, 1e-6)
    out = ops.delta_net_step_(*pools, slots, *step, *constants)
    for r in range(4):
        one = ops.delta_net_step_(*alone, slots[r:r + 1], *(t[r:r + 1] for t in step), *constants)
        assert torch.equal(one[0], out[r])
    assert all(torch.equal(a, b) for a, b in zip(alone, pools))


def test_a_bad_decode_step_or_prompt_is_a_clear_error_that_changes_no_state(ops):
    from inferplug.kernels.delta_rule_ref import CHUNK

    w, pools, step = layer_step(2, 5)
    before = tuple(p.clone() for p in pools)
    constants = (w.conv, w.dt_bias, w.neg_a, w.norm, w.key_of_value, KEY_HEADS, 1e-6)
    with pytest.raises(RuntimeError, match="slot is out of range"):
        ops.delta_net_step_(*pools, torch.tensor([0, SLOTS]), *step, *constants)
    with pytest.raises(RuntimeError, match="shapes do not match"):
        ops.delta_net_step_(*pools, torch.tensor([0, 1]), step[0][:, 1:].contiguous(), *step[1:], *constants)
    with pytest.raises(RuntimeError, match="slot is out of range"):  # delta_net_prompt_, below
        ops.delta_net_prompt_(*pools, SLOTS, False, *step, *constants, CHUNK)
    with pytest.raises(RuntimeError, match="shapes do not match"):
        ops.delta_net_prompt_(*pools, 0, False, step[0], step[1][:1], *step[2:], *constants, CHUNK)
    with pytest.raises(RuntimeError, match="chunks are 64 tokens"):
        ops.delta_net_prompt_(*pools, 0, True, *step, *constants, 16)
    assert all(torch.equal(a, b) for a, b in zip(before, pools))


# A sequence's prompt rows through the chunked form (chunked_delta_rule_, delta_chunks.h) against the torch
# specification kernels/delta_rule_ref.py runs in float64.
def prompt(n: int, heads: int, key_dim: int, value_dim: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.nn.functional.normalize(torch.randn(n, heads, key_dim, generator=gen), dim=-1) for _ in "qk")
    v = torch.randn(n, heads, value_dim, generator=gen)
    g, beta = -torch.rand(n, heads, generator=gen) * 0.5, torch.rand(n, heads, generator=gen)
    return q * key_dim**-0.5, k, v, g, beta, torch.randn(heads, key_dim, value_dim, generator=gen) * 0.3


# widths of whole vectors and not (36 x 44: the scalar tails on either kernel set)
@pytest.mark.parametrize("n, heads, key_dim, value_dim", [(1, 4, 32, 48), (64, 4, 32, 48), (150, 3, 32, 40),
                                                          (100, 2, 36, 44), (200, 2, 128, 128)])
def test_chunked_rule_matches_the_reference(ops, n, heads, key_dim, value_dim):
    from inferplug.kernels.delta_rule_ref import CHUNK, chunked_delta_rule

    args = prompt(n, heads, key_dim, value_dim, n)
    out, state = ops.chunked_delta_rule_(*args, CHUNK)
    ref_out, ref_state = chunked_delta_rule(*(t.double() for t in args))
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state.double(), ref_state, rtol=1e-4, atol=1e-4)


def test_chunked_rules_bits_follow_only_the_chunk_grid_and_the_head(ops):
    """A prompt cut on the chunk grid (the scheduler's) gives the same state and outputs as in one call, and a
    head's bits do not depend on the heads beside it."""
    from inferplug.kernels.delta_rule_ref import CHUNK

    q, k, v, g, beta, state = prompt(300, 3, 32, 48, 7)
    out, after = ops.chunked_delta_rule_(q, k, v, g, beta, state, CHUNK)
    carried, outs = state, []
    for first, last in ((0, CHUNK), (CHUNK, 3 * CHUNK), (3 * CHUNK, 300)):
        part, carried = ops.chunked_delta_rule_(q[first:last], k[first:last], v[first:last], g[first:last],
                                                beta[first:last], carried, CHUNK)
        outs.append(part)
    assert torch.equal(torch.cat(outs), out) and torch.equal(carried, after)
    one = ops.chunked_delta_rule_(*(t[:, 1:2].contiguous() for t in (q, k, v, g, beta)), state[1:2], CHUNK)
    assert torch.equal(one[0], out[:, 1:2]) and torch.equal(one[1], after[1:2])


def test_chunked_rules_bad_inputs_are_clear_errors(ops):
    q, k, v, g, beta, state = prompt(10, 2, 32, 48, 3)
    with pytest.raises(RuntimeError, match="chunks are 64 tokens, the caller's 32"):
        ops.chunked_delta_rule_(q, k, v, g, beta, state, 32)
    with pytest.raises(RuntimeError, match="shapes do not match"):
        ops.chunked_delta_rule_(q, k, v, g, beta, state[:, :16].contiguous(), 64)
    with pytest.raises(RuntimeError, match="shapes do not match"):  # [heads, n]: as many values, read wrongly
        ops.chunked_delta_rule_(q, k, v, g.t().contiguous(), beta, state, 64)
    with pytest.raises(RuntimeError, match="must be <= 0"):
        ops.chunked_delta_rule_(q, k, v, -g, beta, state, 64)


# A sequence's prompt rows of a DeltaNet layer in one call (delta_net_prompt_) against the torch ops models/delta_net.py
# runs without it.
def torch_prompt(w, pools, slot, fresh, step, eps=1e-6):
    from inferplug.models.delta_net import _prompt_rows
    from inferplug.ops.torch_ops import TorchOps

    return _prompt_rows(w, pools, slot, fresh, *step, eps, TorchOps(torch.float32))


def prompt_call(ops, w, pools, slot, fresh, step):
    from inferplug.kernels.delta_rule_ref import CHUNK

    return ops.delta_net_prompt_(*pools, slot, fresh, *step, w.conv, w.dt_bias, w.neg_a, w.norm, w.key_of_value,
                                 KEY_HEADS, 1e-6, CHUNK)


@pytest.mark.parametrize("fresh", [True, False])
def test_a_prompts_rows_match_the_torch_ops(ops, fresh):
    w, pools, step = layer_step(150, 6)
    theirs = tuple(p.clone() for p in pools)
    out = prompt_call(ops, w, pools, 3, fresh, step)
    torch.testing.assert_close(out, torch_prompt(w, theirs, 3, fresh, step), rtol=1e-4, atol=1e-4)
    for ours, ref_pool in zip(pools, theirs):  # slot 3's window and state; the others untouched in both
        torch.testing.assert_close(ours, ref_pool, rtol=1e-4, atol=1e-4)


def test_a_prompt_cut_on_the_chunk_grid_gives_the_same_bits(ops):
    """As the scheduler cuts a hybrid model's prompt into steps: on the 64-token grid."""
    w, pools, step = layer_step(150, 7)
    whole = tuple(p.clone() for p in pools)
    out = prompt_call(ops, w, whole, 1, True, step)
    parts = [prompt_call(ops, w, pools, 1, first == 0, tuple(t[first:last] for t in step))
             for first, last in ((0, 64), (64, 128), (128, 150))]
    assert torch.equal(torch.cat(parts), out)
    assert all(torch.equal(a, b) for a, b in zip(whole, pools))
