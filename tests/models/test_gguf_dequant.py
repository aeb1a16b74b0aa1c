"""Our torch dequantizers against gguf-py's numpy reference (the one transformers' GGUF loader uses)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from inferplug.models.gguf import GGML_TYPES
from inferplug.models.gguf_dequant import BLOCK_DEQUANTIZERS, dequantize


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # numpy on the NaN/inf scales
@pytest.mark.parametrize("type_name", sorted(BLOCK_DEQUANTIZERS))
def test_block_dequant_is_bit_identical_to_gguf_py(type_name):
    _, block_elems, block_bytes = GGML_TYPES[type_name]
    rng = np.random.default_rng(0)
    # Random bytes exercise every bit pattern of quants, scales and high bits; NaN/inf scales
    # must come out the same on both sides too.
    raw = rng.integers(0, 256, size=(64, 4 * block_bytes), dtype=np.uint8)
    expected = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[type_name])
    ours = dequantize(torch.from_numpy(raw.copy()), type_name, (64, 4 * block_elems), block_bytes)
    torch.testing.assert_close(ours, torch.from_numpy(expected), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])
def test_quantize_then_dequantize_stays_close(type_name):
    values = np.random.default_rng(1).standard_normal((8, 256)).astype(np.float32)
    packed = gguf.quants.quantize(values, gguf.GGMLQuantizationType[type_name])
    _, _, block_bytes = GGML_TYPES[type_name]
    ours = dequantize(torch.from_numpy(packed), type_name, values.shape, block_bytes)
    bits = 8 if type_name == "Q8_0" else int(type_name[1])
    step = (values.max() - values.min()) / 2**bits  # one quantization step per block at most
    assert (ours - torch.from_numpy(values)).abs().max() <= step


@pytest.mark.parametrize("type_name,torch_dtype", [("F32", torch.float32), ("F16", torch.float16), ("BF16", torch.bfloat16)])
def test_float_types_are_reinterpreted_exactly(type_name, torch_dtype):
    values = torch.randn(4, 32).to(torch_dtype)
    raw = values.contiguous().view(torch.uint8).reshape(-1)
    assert torch.equal(dequantize(raw, type_name, (4, 32), GGML_TYPES[type_name][2]), values)
