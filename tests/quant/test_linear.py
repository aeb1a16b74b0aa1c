"""Weight-only fp16/int8/int4 layers against the float layers they replace, and row for row alike in any batch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inferplug.errors import ProfileError
from inferplug.quant.linear import Fp16Linear, Int4Linear, Int8Linear, linear, quantize_model


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.float() - expected.float()).norm() / expected.float().norm()).item()


@pytest.fixture
def weight_and_input():
    generator = torch.Generator().manual_seed(0)
    return torch.randn(960, 576, generator=generator) * 0.05, torch.randn(2, 5, 576, generator=generator)


def test_int8_kernel_equals_matmul_with_its_dequantized_weight(weight_and_input):
    weight, x = weight_and_input
    layer = Int8Linear.from_float(weight)
    expected = F.linear(x.bfloat16().float(), layer.dequantized())
    assert relative_error(layer(x), expected) < 5e-3  # only bf16 accumulation/rounding differs


@pytest.mark.parametrize("layer_cls,bound", [(Int8Linear, 0.01), (Int4Linear, 0.12)])
def test_quantization_error_against_the_float_layer(weight_and_input, layer_cls, bound):
    weight, x = weight_and_input
    bias = torch.randn(960)
    out = layer_cls.from_float(weight, bias)(x)
    assert out.shape == (2, 5, 960) and out.dtype == x.dtype
    # 8 bits per channel: ~0.5% error on Gaussian weights; 4 bits per group of 64-128: ~7%.
    assert relative_error(out, F.linear(x, weight, bias)) < bound


def test_linear_dispatches_on_the_weight_kind(weight_and_input):
    weight, x = weight_and_input
    bias = torch.randn(960)
    assert torch.equal(linear(x, weight, bias), F.linear(x, weight, bias))
    quantized = Int8Linear.from_float(weight)
    assert torch.equal(linear(x, quantized, bias), quantized(x) + bias)


@pytest.mark.parametrize("fmt,min_agreement", [("int8", 0.9), ("int4", 0.6)])
def test_quantize_model_swaps_every_linear_of_a_transformers_model(tiny_model_dir, fmt, min_agreement):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    ids = torch.randint(0, model.config.vocab_size, (1, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        float_logits = model(ids).logits
        quantize_model(model, fmt)
        quant_logits = model(ids).logits
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    agreement = (float_logits.argmax(-1) == quant_logits.argmax(-1)).float().mean().item()
    assert agreement >= min_agreement
    assert relative_error(quant_logits, float_logits) < (0.05 if fmt == "int8" else 0.3)


def test_unknown_format_is_a_clear_error(weight_and_input):
    with pytest.raises(ProfileError, match="use one of"):
        quantize_model(torch.nn.Linear(4, 4), "gptq")


def test_int4_rejects_widths_it_cannot_group():
    with pytest.raises(ProfileError, match="divisible by 32"):
        Int4Linear.from_float(torch.randn(8, 40))


def test_an_fp16_rows_bits_do_not_depend_on_the_rows_beside_it():
    """fbgemm's 1- and 2-row AVX2 kernels round otherwise than its 3- to 6-row ones; Fp16Linear pads around them."""
    generator = torch.Generator().manual_seed(0)
    layer = Fp16Linear.from_float(torch.randn(96, 64, generator=generator))
    x = torch.randn(200, 64, generator=generator)
    alone = torch.cat([layer(x[i:i + 1]) for i in range(len(x))])
    for rows in range(1, len(x)):
        assert torch.equal(layer(x[:rows]), alone[:rows]), f"{rows} rows"
