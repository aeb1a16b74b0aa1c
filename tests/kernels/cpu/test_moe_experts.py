"""An MoE layer's block experts in one kernel call (kernels/cpu/moe_experts.cpp, through models/moe.py) against the
per-expert loop of the same block layers: the same bits on every format and path, rows independent of their batch."""

from __future__ import annotations

import pytest
import torch

from inferplug.models.moe import MoeWeights, gate_up_taker, moe_mlp
from inferplug.ops.cpu_ops import CpuKernelOps
from inferplug.ops.torch_ops import TorchOps
from inferplug.quant.block_linear import MXFP4Linear, Q4G128Linear, Q4Linear, Q8Linear, set_prefill_gemm
from inferplug.quant.kquant_linear import Q4KLinear, Q5_0Linear, Q5KLinear, Q6KLinear

HIDDEN, INTER, EXPERTS, TOP_K = 256, 256, 8, 3  # whole Q4_K super-blocks; 8 experts, 3 a row: most picked, one or two not


def make_moe(gate_up_cls, down_cls, seed=0, biased=False) -> MoeWeights:
    """Random block experts; `biased`: with gpt-oss's router and expert biases."""
    g = torch.Generator().manual_seed(seed)
    gate_up = [[gate_up_cls.from_float(torch.randn(INTER, HIDDEN, generator=g) * 0.05) for _ in "gu"] for _ in range(EXPERTS)]
    down = [down_cls.from_float(torch.randn(HIDDEN, INTER, generator=g) * 0.05) for _ in range(EXPERTS)]
    weights = {"gate.weight": torch.randn(EXPERTS, HIDDEN, generator=g), **{
        f"experts.{e}.{name}_proj.weight": w for e in range(EXPERTS)
        for name, w in (("gate", gate_up[e][0]), ("up", gate_up[e][1]), ("down", down[e]))}}
    if biased:
        weights["gate.bias"] = torch.randn(EXPERTS, generator=g)
        weights |= {f"experts.{e}.{name}_proj.bias": torch.randn(width, generator=g) for e in range(EXPERTS)
                    for name, width in (("gate", INTER), ("up", INTER), ("down", HIDDEN))}
    return MoeWeights.take(weights.pop, gate_up_taker(weights.pop, weights.__contains__), "", EXPERTS, biased=biased)


def rows(n, seed=1):
    return torch.randn(n, HIDDEN, generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def kernel_ops(ops):
    return CpuKernelOps(ops, head_dim=64)


def run(moe, h, ops, decode_rows, activation):
    return moe_mlp(h, moe, TOP_K, True, activation, decode_rows, ops)


def loop_ops(kernel_ops) -> TorchOps:
    """The torch ops (no MoE call: the per-expert loop) with the kernels' router, so both pick the same experts."""
    ops = TorchOps()
    ops.router_logits = kernel_ops.router_logits
    return ops


def both(moe, h, kernel_ops, decode_rows, activation="silu_mul"):
    """The one call, and the per-expert loop with the same router and activation kernels."""
    calls, call = [], kernel_ops.moe_experts
    kernel_ops.moe_experts = lambda *args: calls.append(call(*args)) or calls[-1]
    fused = run(moe, h, kernel_ops, decode_rows, getattr(kernel_ops, activation))
    assert calls[0] is not None  # the call ran the layer, not the loop
    return fused, run(moe, h, loop_ops(kernel_ops), decode_rows, getattr(kernel_ops, activation))


@pytest.mark.parametrize("layer_cls", [Q4Linear, Q4G128Linear, Q4KLinear, Q5_0Linear, Q5KLinear, Q6KLinear, Q8Linear,
                                       MXFP4Linear])
@pytest.mark.parametrize("prefill", ["float32", "bfloat16", "int8"])
def test_one_call_equals_the_per_expert_loop(kernel_ops, layer_cls, prefill):
    """Decode rows (int8 kernels) and prefill rows (the layers' prefill path) in one step, bit for bit."""
    moe = make_moe(layer_cls, layer_cls)
    set_prefill_gemm(torch.nn.ModuleList([*moe.gate_up, *moe.down]), prefill)
    h = rows(11)
    fused, loop = both(moe, h, kernel_ops, decode_rows=4)
    assert torch.equal(fused, loop)
    assert fused.abs().sum() > 0


@pytest.mark.parametrize("prefill", ["float32", "int8"])
def test_gpt_oss_experts_with_biases_and_swiglu_oai_in_one_call(kernel_ops, prefill):
    """MXFP4 experts with gpt-oss's router and expert biases and its clamped SwiGLU: the one call equals the loop
    bit for bit (both add a bias as torch's out + bias does, and run the same activation row)."""
    moe = make_moe(MXFP4Linear, MXFP4Linear, biased=True)
    set_prefill_gemm(torch.nn.ModuleList([*moe.gate_up, *moe.down]), prefill)
    h = rows(11) * 4  # gate and up values past the clamp at 7
    fused, loop = both(moe, h, kernel_ops, 4, "swiglu_oai_mul")
    assert torch.equal(fused, loop)
    reference = run(moe, h, TorchOps(), 4, TorchOps().swiglu_oai_mul)  # torch's own activation: the formula
    assert (fused - reference).abs().max() <= 1e-4 * reference.abs().max()


@pytest.mark.parametrize("activation", ["swiglu_oai_mul", "gelu_tanh_mul"])
def test_activation_kernel_matches_the_torch_formula(kernel_ops, activation):
    """The C++ activation rows against torch's (HF's swiglu_oai; F.gelu's tanh form), over gpt-oss's clamp on both
    sides, both signs and GELU's tails (where torch's 1 + tanh cancels: an ulp of 1 times the value's scale)."""
    gate_up = torch.randn(7, 2 * 264, generator=torch.Generator().manual_seed(4)) * 6  # 264: a scalar tail of 8 too
    reference = getattr(TorchOps(), activation)(gate_up)
    torch.testing.assert_close(getattr(kernel_ops, activation)(gate_up), reference, rtol=1e-6,
                               atol=1e-7 * reference.abs().max().item())


def test_gemma4_experts_with_geglu_in_one_call(kernel_ops):
    """Gemma 4's GeGLU experts: the one call equals the loop bit for bit (the same activation row), and torch's own
    GELU within rounding."""
    moe = make_moe(Q4KLinear, Q8Linear)
    h = rows(11)
    fused, loop = both(moe, h, kernel_ops, 4, "gelu_tanh_mul")
    assert torch.equal(fused, loop)
    reference = run(moe, h, TorchOps(), 4, TorchOps().gelu_tanh_mul)
    assert (fused - reference).abs().max() <= 1e-4 * reference.abs().max()


def test_experts_converted_after_load_run_in_the_call(kernel_ops):
    """quantize_model's layers (a float MoE converted expert by expert: MoeWeights.map) take the call as loaded ones do."""
    loaded = make_moe(Q8Linear, Q8Linear)
    converted = MoeWeights(loaded.router, [w.dequantized() for w in loaded.gate_up], [w.dequantized() for w in loaded.down])
    assert converted.blocks() is None  # float experts: the loop
    converted.map(Q8Linear.from_float)
    h = rows(5)
    assert torch.equal(both(converted, h, kernel_ops, None)[0], run(loaded, h, kernel_ops, None, kernel_ops.silu_mul))


def test_a_q4_k_m_layer_mixes_formats_across_projections(kernel_ops):
    """Q4_K gate/up beside Q6_K down, as a Q4_K_M file stores an MoE layer."""
    moe = make_moe(Q4KLinear, Q6KLinear)
    fused, loop = both(moe, rows(9), kernel_ops, decode_rows=None)
    assert torch.equal(fused, loop)


def test_a_row_does_not_depend_on_its_batch(kernel_ops):
    """Each row alone, and each in a batch of 16 sharing experts, give the same bits (decode rows)."""
    moe = make_moe(Q4KLinear, Q6KLinear)
    h = rows(16)
    together = run(moe, h, kernel_ops, None, kernel_ops.silu_mul)
    alone = torch.cat([run(moe, h[i:i + 1], kernel_ops, None, kernel_ops.silu_mul) for i in range(16)])
    assert torch.equal(together, alone)


def test_a_prefill_row_does_not_depend_on_the_prompt_around_it(kernel_ops):
    moe = make_moe(Q4KLinear, Q4KLinear)
    h = rows(40)
    silu = kernel_ops.silu_mul
    assert torch.equal(run(moe, h, kernel_ops, 0, silu)[30:], run(moe, h[30:], kernel_ops, 0, silu))


def test_the_loop_runs_where_the_call_does_not_fit(kernel_ops):
    """Float experts, and gate and up in two formats, keep the per-expert loop."""
    h, chosen, weights = rows(3), torch.zeros(3, TOP_K, dtype=torch.long), torch.ones(3, TOP_K)
    float_moe = MoeWeights(torch.randn(EXPERTS, HIDDEN), [torch.randn(2 * INTER, HIDDEN)] * EXPERTS,
                           [torch.randn(HIDDEN, INTER)] * EXPERTS)
    assert kernel_ops.moe_experts(h, chosen, weights, float_moe, None, kernel_ops.silu_mul) is None
    moe = make_moe(Q4KLinear, Q4KLinear)
    mixed = MoeWeights(moe.router, [*moe.gate_up[:-1], Q8Linear.from_float(moe.gate_up[-1].dequantized())], moe.down)
    assert kernel_ops.moe_experts(h, chosen, weights, mixed, None, kernel_ops.silu_mul) is None


def test_prompt_rows_of_a_onednn_model_take_the_own_bf16_kernel(kernel_ops):
    """Where the layers' prompt rows go through oneDNN, the experts' go through the call in bfloat16 (a oneDNN call
    an expert would be the per-expert loop): the same bits as the model pinned to bfloat16."""
    moe, h = make_moe(Q4KLinear, Q4KLinear), rows(40)
    layers = torch.nn.ModuleList([*moe.gate_up, *moe.down])
    set_prefill_gemm(layers, "bfloat16")
    expected = run(moe, h, kernel_ops, 3, kernel_ops.silu_mul)
    set_prefill_gemm(layers, "bfloat16-onednn")
    fused, _ = both(moe, h, kernel_ops, 3)
    assert torch.equal(fused, expected)


def test_an_expert_out_of_range_is_refused(ops):
    moe = make_moe(Q8Linear, Q8Linear)
    chosen = torch.tensor([[0, EXPERTS]])
    with pytest.raises(RuntimeError, match=f"expert {EXPERTS} is outside 0..{EXPERTS - 1}"):
        ops.moe_experts(rows(1), chosen, torch.ones(1, 2), *moe.blocks(), "int8")
