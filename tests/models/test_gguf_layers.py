"""A GGUF tensor as the layer that runs it (models/gguf_layers.py), against gguf-py's dequantization: exact where
the module says so, within the stated error where it requantizes."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from inferplug.kernels import cpu as cpu_kernels
from inferplug.models.gguf_layers import gguf_layer
from inferplug.models.gguf_random import RANDOM_TYPES, random_blocks

pytestmark = pytest.mark.skipif(cpu_kernels.ops() is None, reason="the CPU kernels do not run here (no AVX2/FMA/F16C)")

SHAPE = (48, 512)  # 48 output rows, 512 inputs: two K-quant super-blocks a row
EXACT = {("Q4_0", "gguf"), ("Q4_1", "gguf"), ("Q4_K", "gguf"), ("Q5_K", "gguf"), ("Q6_K", "gguf"), ("Q8_0", "gguf"), ("Q5_0", "gguf"), ("Q4_0", "int4"),
         ("Q4_1", "int4"), ("Q4_K", "int4"), ("Q8_0", "int8"), ("Q5_0", "int8"), ("MXFP4", "gguf"), ("MXFP4", "int8")}


def _reference(raw: torch.Tensor, type_name: str) -> torch.Tensor:
    values = gguf.quants.dequantize(raw.numpy(), gguf.GGMLQuantizationType[type_name])
    return torch.from_numpy(np.ascontiguousarray(values)).reshape(SHAPE)


@pytest.mark.parametrize("target", ["gguf", "int4", "int8"])
@pytest.mark.parametrize("type_name", RANDOM_TYPES)
def test_each_type_runs_its_own_values(type_name, target):
    raw = random_blocks(type_name, SHAPE, 0.02, torch.Generator().manual_seed(0))
    expected = _reference(raw, type_name)
    layer = gguf_layer(raw, type_name, SHAPE, target)
    ours = layer.dequantized()
    if (type_name, target) in EXACT:
        assert torch.equal(ours, expected)
        if type_name == "Q4_K":  # 4.625 bits a weight to the file's 4.5: its 6-bit codes a byte each
            assert layer.blocks.numel() == raw.numel() * 37 // 36
        if type_name == "Q5_K":  # 5.625 bits a weight to the file's 5.5: its 6-bit codes a byte each
            assert layer.blocks.numel() == raw.numel() * 45 // 44
        if type_name in ("Q5_0", "Q6_K") and target == "gguf":  # the file's own 5.5 / 6.5625 bits
            assert layer.blocks.numel() == raw.numel()
    elif target == "int4":  # requantized to 4 bits: half a Q4_1 step, (max - min) / 30 per 32 weights, plus the
        # fp16 rounding of the min (2^-11 of it) and of the step (2^-11 of it, times a code of at most 15)
        blocks = expected.reshape(-1, 32)
        low = blocks.amin(dim=1, keepdim=True)
        step = (blocks.amax(dim=1, keepdim=True) - low) / 15
        assert ((ours.reshape(-1, 32) - blocks).abs() <= step * (0.5 + 16 * 2**-11) + low.abs() * 2**-10).all()
    else:  # requantized to Q8_0: half a step, max |w| / 254, plus the fp16 rounding of the scale
        blocks = expected.reshape(-1, 32)
        step = blocks.abs().amax(dim=1, keepdim=True) / 127
        assert ((ours.reshape(-1, 32) - blocks).abs() <= step * (0.5 + 2**-9)).all()


@pytest.mark.parametrize("type_name", ["Q4_K", "Q5_0", "Q5_K", "Q6_K"])
def test_k_quant_kernels_run_the_files_values_on_each_kernel_set(type_name):
    """The kernels' own unpacking of a K-quant layer is gguf-py's dequantization exactly on every set, the decode
    matmul the same bits on every set (exact integer sums), and both matmuls agree with x @ the reference."""
    raw = random_blocks(type_name, SHAPE, 0.02, torch.Generator().manual_seed(4))
    expected = _reference(raw, type_name)
    layer = gguf_layer(raw, type_name, SHAPE, "gguf")
    x = torch.randn(5, SHAPE[1], generator=torch.Generator().manual_seed(5))
    reference = x @ expected.T
    decoded = []
    try:
        for isa in cpu_kernels.supported_isas():
            cpu_kernels.set_isa(isa)
            assert torch.equal(getattr(torch.ops.inferplug, layer.unpack)(layer.blocks), expected), isa
            decoded.append(layer(x))
            assert ((decoded[-1] - reference).norm() / reference.norm()).item() < 1e-2  # x rounded to int8 per 32
            prefill = getattr(torch.ops.inferplug, layer.prefill)(x, layer.blocks, "float32")
            torch.testing.assert_close(prefill, reference, rtol=1e-5, atol=1e-5)
    finally:
        cpu_kernels.set_isa(cpu_kernels.chosen_isa())
    assert all(torch.equal(out, decoded[0]) for out in decoded)


@pytest.mark.parametrize("type_name,kernel", [("Q4_K", "q8_head_matmul"), ("Q6_K", "q6_k_head_matmul"),
                                              ("Q8_0", "q8_head_matmul")])
def test_a_head_keeps_a_q6_k_or_q8_0_files_values_and_takes_x_in_two_parts(type_name, kernel):
    """A Q6_K head (Q4_K_M's) in its own blocks, a Q8_0 one as it is, others requantized to Q8_0: each against x in
    two int8 parts, close to float x (test_block_linear bounds it)."""
    raw = random_blocks(type_name, SHAPE, 0.02, torch.Generator().manual_seed(1))
    head = gguf_layer(raw, type_name, SHAPE, "gguf", head=True)
    assert head.kernel == kernel
    x = torch.randn(3, SHAPE[1])
    torch.testing.assert_close(head(x), x @ head.dequantized().T, rtol=1e-3, atol=1e-4)
    if type_name != "Q4_K":
        assert torch.equal(head.dequantized(), _reference(raw, type_name))


def test_a_layer_converted_in_chunks_equals_one_converted_whole(monkeypatch):
    """A file's blocks (gguf_layer) and a float weight (from_float) alike, packed a few rows at a time."""
    import inferplug.quant.block_linear as block_linear
    from inferplug.quant.kquant_linear import Q6KLinear

    raw = random_blocks("Q6_K", SHAPE, 0.02, torch.Generator().manual_seed(2))
    whole = gguf_layer(raw, "Q6_K", SHAPE, "gguf").blocks
    weight = torch.randn(SHAPE, generator=torch.Generator().manual_seed(3))
    packed_whole = Q6KLinear.from_float(weight).blocks
    monkeypatch.setattr(block_linear, "ROW_RUN_WEIGHTS", 5 * SHAPE[1])  # 5 rows a chunk, the last one short
    assert torch.equal(gguf_layer(raw, "Q6_K", SHAPE, "gguf").blocks, whole)
    assert torch.equal(Q6KLinear.from_float(weight).blocks, packed_whole)


@pytest.mark.parametrize("type_name", RANDOM_TYPES)
def test_random_blocks_have_the_asked_spread(type_name):
    raw = random_blocks(type_name, (64, 1024), 0.05, torch.Generator().manual_seed(3))
    values = _reference_shape(raw, type_name, (64, 1024))
    assert torch.isfinite(values).all()
    assert 0.04 < values.std().item() < 0.06 and abs(values.mean().item()) < 0.02


def _reference_shape(raw, type_name, shape):
    values = gguf.quants.dequantize(raw.numpy(), gguf.GGMLQuantizationType[type_name])
    return torch.from_numpy(np.ascontiguousarray(values)).reshape(shape)
