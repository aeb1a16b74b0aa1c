"""References for the weight-only formats that share no arithmetic with our kernels: the float weights a layer
holds, decoded by gguf-py from its blocks, and the kernels' int8 rounding of a layer's input, written from
its definition. Used by tests/engine/test_quantized.py and tests/quant/test_smollm2_quant.py."""

from __future__ import annotations

import copy

import gguf
import torch

from inferplug.quant.block_linear import Q8HeadLinear, _deinterleave
from inferplug.quant.linear import head_layer, layer_class

# GGUF's blocks of 32 inputs, fields in file order: Q8_0 = fp16 scale + 32 int8; Q4_1 = fp16 scale + fp16 min
# + 16 bytes of nibbles (input j low, j + 16 high). Our layers store a row's fields one after the other.
GGUF_BLOCKS = {"int8": (gguf.GGMLQuantizationType.Q8_0, (2, 32)), "int4": (gguf.GGMLQuantizationType.Q4_1, (2, 2, 16))}


def gguf_decoded(layer, kind: str) -> torch.Tensor:
    """A block layer's weight as gguf-py's dequantize reads its bytes, put back in GGUF's block order."""
    qtype, sizes = GGUF_BLOCKS[kind]
    rows, blocks = layer.out_features, layer.in_features // 32
    *fields, quants = (f.reshape(rows, blocks, -1) for f in layer.blocks.split([blocks * size for size in sizes], dim=1))
    quants = _deinterleave(quants)  # the kernels' byte order, not arithmetic
    in_file_order = torch.cat([*fields, quants], dim=2).reshape(rows, -1)
    return torch.from_numpy(gguf.quants.dequantize(in_file_order.numpy(), qtype))


def assert_nearest_rounding(weight: torch.Tensor, decoded: torch.Tensor, kind: str) -> None:
    """Each weight sits within half a step of its float value. Q8_0: step d = fp16(amax / 127), so the error is
    <= amax / 254 * (1 + 2^-11). Q4_1: step d = fp16((max - m) / 15) with m = fp16(min); the fp16 roundings
    shift the grid's ends by <= |min| * 2^-11 and 15 * d * 2^-11 (clamped there), so <= 0.51 * d + |min| * 2^-11."""
    blocks, error = weight.reshape(-1, 32), (decoded - weight).abs().reshape(-1, 32)
    if kind == "int8":
        bound = blocks.abs().amax(-1) / 254 * (1 + 2**-11)
    else:
        low, high = blocks.amin(-1), blocks.amax(-1)
        bound = 0.51 * (high - low) / 15 * (1 + 2**-11) + low.abs() * 2**-11
    assert (error.amax(-1) <= bound).all(), f"{kind}: a weight is further than half a step from its float value"


def int8_activations(module, args):
    """The block kernels' rounding of a layer's input (block_linear.py): per row and 32 inputs,
    q = round-half-even(x * 127 / amax), times amax / 127 (an fp32 scale)."""
    (x,) = args
    blocks = x.reshape(*x.shape[:-1], -1, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    q = torch.round(blocks * torch.where(amax > 0, 127 / amax, 0.0))
    return (q * (amax / 127)).reshape(x.shape)


def int8_decode_activations(module, args):
    """The engine's rounding: decode rows through the kernels, prefill rows float (block_linear.py). HF's
    generate feeds a decode step one token; the tests' prompts have several."""
    (x,) = args
    return int8_activations(module, args) if x.shape[-2] == 1 else x


def with_int8_inputs(model, decode_only: bool = False):
    """A copy of an HF model whose decoder layers' linears see their inputs (`decode_only`: a decode step's)
    rounded as the kernels do; the lm_head keeps float inputs (Q8HeadLinear takes them in two int8 parts: ~15 bits)."""
    model = copy.deepcopy(model)
    for linear in model.model.layers.modules():
        if isinstance(linear, torch.nn.Linear):
            linear.register_forward_pre_hook(int8_decode_activations if decode_only else int8_activations)
    return model


def weights_reference(model, fmt: str, int8_inputs: bool):
    """A copy of an HF fp32 model on the weights `fmt` leaves: fp16-rounded ones (fbgemm's fp32 math on them), or
    Q8_0 / Q4_1 blocks decoded by gguf-py (each checked against its float weight); the lm_head on its own copy
    (Q8_0 under int8/int4, on float inputs). `int8_inputs`: round the decode steps' layer inputs as the engine does."""
    reference = with_int8_inputs(model, decode_only=True) if int8_inputs else copy.deepcopy(model)
    with torch.no_grad():
        for linear in reference.model.layers.modules():
            if isinstance(linear, torch.nn.Linear):
                if fmt == "fp16":
                    linear.weight.copy_(linear.weight.half().float())
                    continue
                decoded = gguf_decoded(layer_class(fmt, "cpu").from_float(linear.weight), fmt)
                assert_nearest_rounding(linear.weight, decoded, fmt)
                linear.weight.copy_(decoded)
        head = head_layer(reference.lm_head.weight, fmt)
        weight = gguf_decoded(head, "int8") if isinstance(head, Q8HeadLinear) else reference.lm_head.weight.half()
        reference.lm_head.weight = torch.nn.Parameter(weight.float())  # a new parameter: unties it from the embedding
    return reference
