"""The prefill kernels (kernels/cpu/prefill_gemm.h: q4_prefill_matmul, q4_k_prefill_matmul, q8_prefill_matmul) on each kernel set, against
torch's reference: the dequantized weight (BlockLinear.dequantized) times x in the same precision, in float64."""

from __future__ import annotations

import pytest
import torch

from inferplug.hardware import probe
from inferplug.quant.block_linear import MXFP4Linear, Q4G128Linear, Q4Linear, Q8Linear
from inferplug.quant.kquant_linear import Q4KLinear, Q5_0Linear, Q5KLinear, Q6KLinear

PRECISIONS = ("float32", "bfloat16")


def reference(x: torch.Tensor, weight: torch.Tensor, precision: str) -> torch.Tensor:
    if precision == "bfloat16":  # both operands rounded to bf16; the products and sums exact here
        x, weight = x.bfloat16(), weight.bfloat16()
    return x.double() @ weight.double().T


SHAPES = [(1, 32), (40, 288), (200, 576), (300, 1088)]
Q4_K_SHAPES = [(1, 256), (40, 768), (300, 1280)]  # whole super-blocks of 256 inputs (and groups of 128)


@pytest.mark.parametrize("layer_cls,out_features,in_features", [(cls, *shape) for cls in (Q4Linear, Q5_0Linear, Q8Linear, MXFP4Linear)
                                                                for shape in SHAPES]
                         + [(Q4KLinear, *shape) for shape in Q4_K_SHAPES]
                         + [(Q4G128Linear, *shape) for shape in Q4_K_SHAPES]
                         + [(cls, *shape) for cls in (Q5KLinear, Q6KLinear) for shape in Q4_K_SHAPES])
@pytest.mark.parametrize("precision", PRECISIONS)
# N: whole and partial 16/32-column micro-panels, several panels; K: a partial last K block (288, 576), several (1088)
@pytest.mark.parametrize("rows", [1, 5, 13, 77])
def test_kernel_equals_the_dequantized_matmul_in_its_precision(ops, layer_cls, precision, out_features, in_features,
                                                               rows):
    gen = torch.Generator().manual_seed(out_features + rows)
    layer = layer_cls.from_float(torch.randn(out_features, in_features, generator=gen) * 0.05)
    x = torch.randn(rows, in_features, generator=gen)
    out = getattr(ops, layer.prefill)(x, layer.blocks, precision)
    expected = reference(x, layer.dequantized(), precision)
    # float32 sums of in_features products, in another order than float64's
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=2e-6 * in_features ** 0.5)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_threads_and_panel_widths_change_no_bit(ops, precision):
    """2 threads split the weight rows into other panels than 1 does: the same bits (a row's sums go in one order)."""
    layer = Q4Linear.from_float(torch.randn(1100, 576, generator=torch.Generator().manual_seed(1)) * 0.05)
    x = torch.randn(29, 576)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ops.q4_prefill_matmul(x, layer.blocks, precision)
        torch.set_num_threads(2)
        two = ops.q4_prefill_matmul(x, layer.blocks, precision)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


def test_bf16_takes_vdpbf16ps_where_the_avx512_set_runs_on_a_cpu_with_it(ops):
    has_dot = ops.isa().startswith("avx512") and "avx512_bf16" in probe().cpu_flags
    assert ops.bfloat16_dot() == ("vdpbf16ps" if has_dot else "fma")


def test_an_unknown_precision_is_rejected(ops):
    layer = Q8Linear.from_float(torch.randn(8, 64))
    with pytest.raises(RuntimeError, match="precision must be float32 or bfloat16"):
        ops.q8_prefill_matmul(torch.randn(2, 64), layer.blocks, "int8")


@pytest.mark.parametrize("out_features,in_features", [(40, 288), (1100, 576)])  # one panel; two and a partial one
def test_onednn_path_is_torchs_bf16_matmul_of_the_dequantized_weight(ops, out_features, in_features):
    """prefill_gemm = "bfloat16-onednn" (BlockLinear._onednn_prefill): x and w rounded to bf16, float32 sums, the
    result rounded to bf16."""
    gen = torch.Generator().manual_seed(out_features)
    layer = Q4Linear.from_float(torch.randn(out_features, in_features, generator=gen) * 0.05)
    layer.prefill_gemm = "bfloat16-onednn"
    x = torch.randn(77, in_features, generator=gen)
    out = layer(x, decode_rows=0)
    expected = reference(x, layer.dequantized(), "bfloat16")
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), expected, rtol=2 ** -8, atol=2e-6 * in_features ** 0.5)


def test_onednn_path_gives_a_row_the_same_bits_whatever_rows_share_its_call(ops):
    """Every oneDNN call is one GEMM shape ([ONEDNN_ROWS, K] x [K, panel]), the last rows padded: a row's sums do not
    depend on how many rows a step holds (batch invariance)."""
    gen = torch.Generator().manual_seed(5)
    layer = Q4Linear.from_float(torch.randn(1100, 576, generator=gen) * 0.05)
    layer.prefill_gemm = "bfloat16-onednn"
    x = torch.randn(200, 576, generator=gen)
    whole = layer(x, decode_rows=0)
    for rows in (1, 5, 64, 77):
        assert torch.equal(layer(x[:rows], decode_rows=0), whole[:rows]), rows
    assert torch.equal(layer(x[130:], decode_rows=0), whole[130:])
