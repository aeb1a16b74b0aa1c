"""Q4_1 / Q4_K / Q5_0 / Q5_K / Q6_K / Q8_0 / MXFP4 block layers (quant/block_linear.py) and their kernels against float matmuls."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inferplug.errors import ProfileError
from inferplug.quant.block_linear import (KERNEL_MAX_ROWS, PREFILL_GEMMS, MXFP4Linear, Q4G128Linear, Q4Linear,
                                         Q8HeadLinear, Q8Linear, set_prefill_gemm)
from inferplug.quant.kquant_linear import Q4KLinear, Q5_0Linear, Q5KLinear, Q6KHeadLinear, Q6KLinear
from inferplug.quant.linear import Fp16Linear, head_layer


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual - expected).norm() / expected.norm()).item()


def on_threads(threads: int, fn, *args):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return fn(*args)
    finally:
        torch.set_num_threads(before)


WIDTH = 768  # 24 blocks: a run of 16 and a short one, in whole Q4_K super-blocks of 8
LAYERS = [Q4Linear, Q4G128Linear, Q4KLinear, Q5_0Linear, Q5KLinear, Q6KLinear, Q8Linear, MXFP4Linear]


@pytest.fixture
def weight():
    return torch.randn(200, WIDTH, generator=torch.Generator().manual_seed(0)) * 0.05


# Q5_K's simplified packer is not idempotent: under a 6-bit sub-scale a block's largest weight may take code 30 of 31,
# and repacking then lowers sc. A file's Q5_K blocks load as stored (test_gguf_layers), and its codes round-trip below.
# MXFP4's scale follows a block's largest value: a block whose largest code is under ±8 repacks at half its scale and
# twice its codes, the same values.
@pytest.mark.parametrize("layer_cls", [cls for cls in LAYERS if cls is not Q5KLinear])
def test_packing_round_trips(ops, layer_cls, weight):
    """Re-quantizing a block layer's own dequantized weight gives its blocks back bit for bit (so a GGUF
    Q4_1 / Q8_0 model runs its file's weights: the SmolLM2 test below checks that)."""
    layer = layer_cls.from_float(weight)
    repacked = layer_cls.from_float(layer.dequantized())
    if layer_cls is MXFP4Linear:
        assert torch.equal(repacked.dequantized(), layer.dequantized())
    else:
        assert torch.equal(repacked.blocks, layer.blocks)


@pytest.mark.parametrize("layer_cls,levels", [(Q4KLinear, 16), (Q5KLinear, 32)])
def test_k_quant_codes_round_trip_through_their_quant_bytes(layer_cls, levels):
    codes = torch.randint(0, levels, (50, 7, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(levels))
    quants = layer_cls.pack_codes(codes)
    assert quants.shape[-1] == layer_cls.fields[-1]
    assert torch.equal(layer_cls.codes(quants), codes)


@pytest.mark.parametrize("layer_cls,bound", [(Q4Linear, 0.12), (Q4G128Linear, 0.15), (Q4KLinear, 0.12), (Q5KLinear, 0.06),
                                             (Q5_0Linear, 0.06),
                                             (Q6KLinear, 0.03), (Q8Linear, 0.01), (MXFP4Linear, 0.15)])
def test_quantization_error_against_the_float_weight(ops, layer_cls, bound, weight):
    layer = layer_cls.from_float(weight)
    assert relative_error(layer.dequantized(), weight) < bound  # 4 bits: ~7%; 8 bits: ~0.5%


@pytest.mark.parametrize("layer_cls", LAYERS)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 7, KERNEL_MAX_ROWS])
@pytest.mark.parametrize("threads", [1, 2])
def test_kernel_equals_matmul_with_the_dequantized_weight(ops, layer_cls, rows, threads, weight):
    """The kernel rounds the activations to int8 per block of 32 (llama.cpp's Q8 activations): ~0.5% error."""
    layer = layer_cls.from_float(weight, bias=torch.randn(200))
    x = torch.randn(rows, WIDTH, generator=torch.Generator().manual_seed(rows))
    out = on_threads(threads, layer, x)
    expected = F.linear(x, layer.dequantized(), layer.bias)
    assert relative_error(out, expected) < 1e-2
    assert torch.equal(out[:1], layer(x[:1])), "a row's result must not depend on the rows beside it"


@pytest.mark.parametrize("layer_cls", [Q4KLinear, Q6KLinear, Q8Linear])
@pytest.mark.parametrize("rows", [KERNEL_MAX_ROWS, 17])
def test_rows_over_several_chunks_of_x_equal_each_row_alone(ops, layer_cls, rows):
    """4352 inputs (136 blocks): a pass takes x 32 blocks at a time at 8 rows, 64 where x holds more rows than a
    pass, and whole rows at one row (quant_dot.h's chunk_blocks), where Q6_K's and Q8_0's rows (over 3 KiB) are also
    asked for 16 KiB ahead; x goes run-major: every row still gives its bits alone."""
    gen = torch.Generator().manual_seed(rows)
    layer = layer_cls.from_float(torch.randn(40, 4352, generator=gen) * 0.05)
    x = torch.randn(rows, 4352, generator=gen)
    out = layer(x)
    assert relative_error(out, F.linear(x, layer.dequantized())) < 1e-2
    assert all(torch.equal(out[i:i + 1], layer(x[i:i + 1])) for i in range(rows))


@pytest.mark.parametrize("layer_cls", LAYERS)
@pytest.mark.parametrize("rows", [1, 3, 17])
def test_an_input_order_is_gathered_as_the_kernel_quantizes_x(ops, layer_cls, rows, weight):
    """A GPTQ act-order weight's inputs (quant/checkpoint_layers.py): x[:, order] without the copy, bit for bit."""
    blocks = layer_cls.from_float(weight).blocks
    kernel = getattr(ops, layer_cls.kernel)
    gen = torch.Generator().manual_seed(rows)
    x, order = torch.randn(rows, weight.shape[1], generator=gen), torch.randperm(weight.shape[1], generator=gen)
    assert torch.equal(kernel(x, blocks, order), kernel(x[:, order].contiguous(), blocks))
    with pytest.raises(RuntimeError, match="permutation of the weight's"):
        kernel(x, blocks, order[1:])


@pytest.mark.parametrize("layer_cls", [Q4Linear, Q5_0Linear, Q8Linear, Q8HeadLinear])
@pytest.mark.parametrize("width", [32, 96, 256, 288])  # blocks go 8 at a time: a row's last group may be short
def test_rows_of_any_block_count(ops, layer_cls, width):
    layer = layer_cls.from_float(torch.randn(24, width))
    x = torch.randn(5, width)
    assert relative_error(layer(x), F.linear(x, layer.dequantized())) < 1e-2


# Q4_K rows hold whole super-blocks of 256 inputs; Q4_G128 rows whole groups of 128 (3 of them: a short float step)
@pytest.mark.parametrize("layer_cls,width,row_bytes", [(Q4KLinear, w, w // 256 * 148) for w in (256, 512, 768, 4352)]
                         + [(Q5KLinear, w, w // 256 * 180) for w in (256, 768, 4352)]
                         + [(Q6KLinear, w, w // 256 * 210) for w in (256, 768)]
                         + [(Q4G128Linear, w, w // 128 * 68) for w in (128, 384, 768)])
def test_rows_of_whole_groups(ops, layer_cls, width, row_bytes):
    layer = layer_cls.from_float(torch.randn(24, width))
    assert layer.blocks.shape[1] == row_bytes
    x = torch.randn(5, width)
    assert relative_error(layer(x), F.linear(x, layer.dequantized())) < 1e-2


@pytest.mark.parametrize("layer_cls", [Q8HeadLinear, Q6KHeadLinear])
@pytest.mark.parametrize("rows", [1, 3, KERNEL_MAX_ROWS])
@pytest.mark.parametrize("threads", [1, 2])
def test_head_kernels_take_x_to_about_15_bits(ops, layer_cls, rows, threads, weight):
    """x in two int8 parts: a block's rounding (step s = amax / 127) and its remainder's (step at most s / 254), so
    each input is off by at most s / 508; the float sums add a few ulps. One int8 rounding (the layers' kernels)
    is off by up to s / 2, a bound 254 times wider, and it misses this one."""
    layer = layer_cls.from_float(weight)
    x = torch.randn(rows, WIDTH, generator=torch.Generator().manual_seed(rows))
    w = layer.dequantized()
    step = x.reshape(rows, -1, 32).abs().amax(-1, keepdim=True).expand(-1, -1, 32).reshape(rows, WIDTH) / 127
    bound = (step / 508) @ w.abs().T + 4 * WIDTH * 2.0**-24 * (x.abs() @ w.abs().T)
    out = on_threads(threads, layer, x)
    assert ((out - F.linear(x, w)).abs() <= bound).all()
    one_rounding = torch.round(x / step) * step  # the layers' int8 x
    assert ((F.linear(one_rounding, w) - F.linear(x, w)).abs() > bound).any()


def test_head_layer_takes_q8_blocks_when_they_are_exact_or_the_layers_are_quantized(ops, weight):
    exact = Q8Linear.from_float(weight).dequantized()  # a GGUF Q8_0 embedding's values
    assert isinstance(head_layer(exact, "fp16"), Q8HeadLinear)
    assert isinstance(head_layer(weight, "fp16"), Fp16Linear)  # Q8_0 would round it: fp16 keeps fp32 parity
    assert isinstance(head_layer(weight, "int4"), Q8HeadLinear)


@pytest.mark.parametrize("layer_cls", [*LAYERS, Q8HeadLinear])
def test_the_kernels_unpacked_weight_is_the_torch_references_bit_for_bit(ops, layer_cls):
    """The prefill rows' float weight (the vector unpacking) against BlockLinear.dequantized, a run's worth of
    blocks and a short last run (K = 18 blocks)."""
    layer = layer_cls.from_float(torch.randn(40, WIDTH, generator=torch.Generator().manual_seed(3)) * 0.05)
    assert torch.equal(getattr(ops, layer.unpack)(layer.blocks), layer.dequantized())


def prefill_reference(layer, x: torch.Tensor, path: str) -> torch.Tensor:
    """Prefill rows by torch: dequantize, then matmul in the path's precision (float32 sums; bfloat16-onednn's result
    rounded to bf16 before the bias)."""
    if path == "int8":
        return layer(x)  # the decode kernel, rows as they are
    weight, rounded = layer.dequantized(), path.startswith("bfloat16")
    out = F.linear(x.bfloat16().float() if rounded else x, weight.bfloat16().float() if rounded else weight)
    out = out.bfloat16().float() if path == "bfloat16-onednn" else out
    return out if layer.bias is None else out + layer.bias


@pytest.mark.parametrize("layer_cls", LAYERS)
@pytest.mark.parametrize("path", PREFILL_GEMMS)
@pytest.mark.parametrize("decode_rows", [0, 1, 7])
def test_prefill_rows_take_the_models_prefill_path(ops, layer_cls, path, weight, decode_rows):
    """The rows after `decode_rows` take the prefill path (torch's dequantize-then-matmul in its precision); the
    decode rows take the int8 kernel, as alone."""
    layer = layer_cls.from_float(weight, bias=torch.randn(200))
    set_prefill_gemm(layer, path)
    x = torch.randn(KERNEL_MAX_ROWS + 1, WIDTH)
    out = layer(x, decode_rows)
    # bfloat16-onednn: a sum in another order may round to another bf16 (an ulp of the sum, ~2^-7 here, before the bias)
    tol = 2 ** -6 if path == "bfloat16-onednn" else 1e-5
    torch.testing.assert_close(out[decode_rows:], prefill_reference(layer, x[decode_rows:], path), rtol=tol, atol=tol)
    assert torch.equal(out[:decode_rows], layer(x[:decode_rows]))


@pytest.mark.parametrize("layer_cls", LAYERS)
@pytest.mark.parametrize("path", PREFILL_GEMMS)
def test_a_rows_result_does_not_depend_on_how_many_rows_share_the_call(ops, layer_cls, path, weight):
    """Batch invariance: each row alone equals that row inside calls of 2 to 512 rows, bit for bit, both for
    decode rows (the int8 kernel) and prefill rows (the model's prefill path), on 1 thread and on 2."""
    layer = layer_cls.from_float(weight)
    set_prefill_gemm(layer, path)
    x = torch.randn(512, WIDTH)
    for decode_rows in (None, 0):  # None: every row decodes; 0: every row is a prefill row
        alone = torch.cat([layer(x[i : i + 1], decode_rows) for i in range(13)])
        for rows in (2, 3, 4, 5, 7, 8, 9, 12, 13, 16, 17, 64, 65, 300, 512):
            for threads in (1, 2):
                got = on_threads(threads, layer, x[:rows], decode_rows)
                assert torch.equal(got[:13], alone[: min(rows, 13)]), (decode_rows, rows, threads)


def test_an_unknown_prefill_path_is_a_profile_error(ops, weight):
    with pytest.raises(ProfileError, match="not a prefill path: use one of float32, bfloat16, bfloat16-onednn, int8"):
        set_prefill_gemm(Q4Linear.from_float(weight), "fp8")


def test_kernel_rejects_bad_shapes_with_a_clear_error(ops, weight):
    layer = Q4Linear.from_float(weight)
    with pytest.raises(RuntimeError, match="multiple of 32 .* and match"):
        ops.q4_matmul(torch.randn(1, 544), layer.blocks)
    with pytest.raises(RuntimeError, match="256 for Q4_K"):
        ops.q4_k_matmul(torch.randn(1, 288), Q4KLinear.from_float(torch.randn(8, 256)).blocks)
    with pytest.raises(RuntimeError, match="float32"):
        ops.q4_matmul(torch.randn(1, WIDTH, dtype=torch.float64), layer.blocks)


def test_widths_that_do_not_split_into_blocks_are_refused(ops):
    from inferplug.errors import ProfileError

    with pytest.raises(ProfileError, match="divisible by 32"):
        Q4Linear.from_float(torch.randn(8, 40))
    with pytest.raises(ProfileError, match="whole groups of 8 blocks"):
        Q4KLinear.from_float(torch.randn(8, 288))


@pytest.mark.smollm2
def test_block_layers_run_the_gguf_files_own_weights(ops, smollm2_gguf):
    """SmolLM2's layers are Q4_1 and its embedding Q8_0: packing their dequantized weights into the block
    layers gives the file's values back exactly, so int4 (and an int8 head) add no error of their own."""
    from inferplug.models.loader import load_weights

    weights = load_weights(smollm2_gguf, torch.float32)
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.29.mlp.down_proj.weight"):
        assert torch.equal(Q4Linear.from_float(weights[name]).dequantized(), weights[name]), name
    embedding = weights["model.embed_tokens.weight"]
    assert torch.equal(Q8Linear.from_float(embedding).dequantized(), embedding)
