"""Weight-only fp16 / int8 / int4 linear layers (the gpt-fast recipe) and quantize_model, which swaps them in.

Decode streams every weight once per step, so it is memory-bound: fewer bytes per weight, faster steps.
- fp16: fbgemm's fp16 GEMM (fp32 activations and accumulation). Half the bytes of fp32, and on AVX2
  CPUs faster than torch's fp32 matmul at every batch size; greedy output matches fp32.
- int8 / int4: on an x86 CPU with AVX2, inferplug's own kernels on GGUF Q8_0 / Q4_1 blocks
  (quant/block_linear.py, `layer_class`); elsewhere torch's kernels with bf16 activations (their fast
  path; their fp32 path is ~20x slower than a float matmul), so a float32 model runs these layers in bf16.

Engine wiring (the native engine applies the resolver's Plan.weight_format):
    quantize_model(model, "int8")          # DecoderModel or any nn.Module, in place
    linear(x, weight, bias)                # in llama.py instead of F.linear: float tensor or quantized layer
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from inferplug.errors import ProfileError
from inferplug.quant.base import COMPUTE_DTYPE, WeightOnlyLinear
from inferplug.quant.formats import LOADED_AS_LAYERS, head_format
from inferplug.quant.block_linear import Q4Linear, Q8HeadLinear, Q8Linear

# 32 = GGUF's legacy block: a Q4_0/Q4_1 source maps onto the int4 grid almost exactly (SmolLM2 Q4_1:
# min logit cosine 0.986 at 32 vs -0.18 at 64/128).
INT4_GROUP_SIZE = 32


class Fp16Linear(WeightOnlyLinear):
    """fp16 weights packed for fbgemm (x86 CPUs with AVX2 and F16C); fp32 activations and accumulation."""

    compute_dtype = torch.float32

    def __init__(self, packed, out_features: int, in_features: int):
        super().__init__()
        self.out_features, self.in_features = out_features, in_features
        self.packed = packed  # fbgemm's packed fp16 matrix, bias included
        self.bias = None

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> "Fp16Linear":
        if weight.device.type != "cpu":
            raise ProfileError("fp16 weight packing runs on the CPU only; on CUDA use dtype = \"float16\"")
        w = weight.detach().float().contiguous()
        packed = torch.ops.quantized.linear_prepack_fp16(w, None if bias is None else bias.detach().float())
        return cls(packed, *w.shape)

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        # fbgemm's AVX2 kernels take rows 1 to 6 at a time, and its 1- and 2-row kernels round otherwise than the
        # rest: a row's bits would depend on how many rows share its call. A call is padded so that no row takes
        # them (1 or 2 rows past a multiple of 6 become 3): batch invariance, at no cost (3 rows stream the weights
        # as 1 does).
        rows = x.shape[0]
        short = 3 - rows % 6 if rows % 6 in (1, 2) else 0
        if short:
            x = torch.cat([x, x.new_zeros(short, x.shape[1])])
        out = torch.ops.quantized.linear_dynamic_fp16(x, self.packed)
        return out[:rows] if short else out

    def nbytes(self) -> int:
        return 2 * self.out_features * self.in_features  # the packed matrix is opaque; the bias is negligible


class Int8Linear(WeightOnlyLinear):
    """Per-output-channel symmetric int8: w ≈ q * scale, q in [-127, 127]."""

    def __init__(self, weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight)
        self.register_buffer("scales", scales)
        self.register_buffer("bias", None if bias is None else bias.to(COMPUTE_DTYPE))

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> "Int8Linear":
        w = weight.detach().float()
        # Round with the bf16 scale the kernel will multiply by, not the exact one.
        scales = (w.abs().amax(dim=1) / 127).clamp(min=1e-10).to(COMPUTE_DTYPE)
        q = torch.round(w / scales.float()[:, None]).clamp(-127, 127).to(torch.int8)
        return cls(q.contiguous(), scales, bias)

    def dequantized(self) -> torch.Tensor:
        return self.weight.float() * self.scales.float()[:, None]

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch._weight_int8pack_mm(x, self.weight, self.scales)


class Int4Linear(WeightOnlyLinear):
    """Group-wise asymmetric int4 (CPU): w ≈ q * scale + min per 32 inputs, q in [0, 15]."""

    def __init__(self, packed: torch.Tensor, scales_and_zeros: torch.Tensor, group_size: int,
                 out_features: int, in_features: int, bias: torch.Tensor | None = None):  # fmt: skip
        super().__init__()
        self.out_features, self.in_features, self.group_size = out_features, in_features, group_size
        self.register_buffer("packed", packed)
        self.register_buffer("scales_and_zeros", scales_and_zeros)
        self.register_buffer("bias", None if bias is None else bias.to(COMPUTE_DTYPE))

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> "Int4Linear":
        if weight.device.type != "cpu":
            raise ProfileError("int4 weights run on the CPU kernel only; use quantization.format = \"int8\" on CUDA")
        out_features, in_features = weight.shape
        group = INT4_GROUP_SIZE
        if in_features % group:
            raise ProfileError(f"int4 needs in_features divisible by 32; this layer has {in_features}. Use int8.")
        w = weight.detach().float().reshape(out_features, in_features // group, group)
        low, high = w.amin(dim=-1, keepdim=True), w.amax(dim=-1, keepdim=True)
        scale = ((high - low) / 15).clamp(min=1e-10)
        q = torch.round((w - low) / scale).clamp(0, 15).to(torch.int32).reshape(out_features, in_features)
        # The kernel computes (q - 8) * scale + zero, so zero = min + 8 * scale; layout [groups, out, 2].
        zeros = low + 8 * scale
        scales_and_zeros = torch.cat([scale, zeros], dim=-1).transpose(0, 1).contiguous().to(COMPUTE_DTYPE)
        packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
        return cls(packed, scales_and_zeros, group, out_features, in_features, bias)

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch._weight_int4pack_mm_for_cpu(x, self.packed, self.group_size, self.scales_and_zeros)


QUANTIZED_LINEARS: dict[str, type[WeightOnlyLinear]] = {"fp16": Fp16Linear, "int8": Int8Linear, "int4": Int4Linear}
BLOCK_LINEARS: dict[str, type[WeightOnlyLinear]] = {"int8": Q8Linear, "int4": Q4Linear}


def linear(x: torch.Tensor, weight, bias: torch.Tensor | None = None, decode_rows: int | None = None) -> torch.Tensor:
    """F.linear for a float weight tensor, or the quantized layer's own kernel (`decode_rows`: WeightOnlyLinear)."""
    if isinstance(weight, torch.Tensor):
        return F.linear(x, weight, bias)
    out = weight.forward(x, decode_rows)  # our layers have no hooks: skip nn.Module.__call__ (~10 us, 121 calls a token)
    return out if bias is None else out + bias


def layer_class(fmt: str, device: str) -> type[WeightOnlyLinear]:
    """The layer that runs `fmt` on `device`: int4 and int8 on an AVX2 CPU run inferplug's own kernels."""
    from inferplug.kernels import cpu as cpu_kernels

    if fmt in BLOCK_LINEARS and cpu_kernels.runs_on(device):
        return BLOCK_LINEARS[fmt]
    return QUANTIZED_LINEARS[fmt]


def quantize_model(model, fmt: str):
    """Replace the model's linear weights by `fmt` ("fp16" / "int8" / "int4") layers in place; returns the model.

    Every layer gets `fmt` but the lm_head, which gets `head_layer`. inferplug's DecoderModel has each layer's
    fused qkv / o / gate_up / down weights replaced (layer_converter's; the decoder may have done it as it built
    each layer) and its embedding table stays float (a tied lm_head gets its own copy); an nn.Module (a transformers
    model, the tests' reference) has its nn.Linear children swapped, its `lm_head` child as the head.
    """
    if isinstance(model, nn.Module):
        if fmt not in QUANTIZED_LINEARS:
            raise ProfileError(f"quantization.format {fmt!r} cannot run weight-only; use one of {sorted(QUANTIZED_LINEARS)}")
        device = next(model.parameters()).device.type
        with torch.no_grad():
            _swap_linears(model, fmt, layer_class(fmt, device))
        return model
    device = model.norm.device.type  # the head may be a layer
    convert = layer_converter(fmt, device)
    with torch.no_grad():
        for layer in model.layers:  # a weight loaded (or built) as a layer already stays as it is
            layer.map_linears(convert)
        model.lm_head = convert_head(model.lm_head, fmt)
    return model


def convert_head(head, fmt: str):
    """The lm_head under `fmt` layers: a float weight as head_layer makes it (a GGUF's, an F16 file's, as fp16
    layers' head), a layer the loader made as it is."""
    return head_layer(head, "fp16" if fmt == "gguf" else fmt) if isinstance(head, torch.Tensor) else head


def layer_converter(fmt: str, device: str) -> Callable[[Any], Any]:
    """One decoder linear under `fmt` layers: a float weight as `fmt`'s layer (a GGUF's float linears, an F16
    file's, as fp16), a layer the loader made (AWQ / GPTQ, a GGUF's blocks) as it is."""
    float_fmt = "fp16" if fmt == "gguf" else fmt
    if float_fmt not in QUANTIZED_LINEARS and fmt not in LOADED_AS_LAYERS:
        raise ProfileError(f"quantization.format {fmt!r} cannot run weight-only; use one of {sorted(QUANTIZED_LINEARS)}")
    layer_cls = layer_class(float_fmt, device) if float_fmt in QUANTIZED_LINEARS else None  # AWQ / GPTQ: all layers
    return lambda w: layer_cls.from_float(w) if isinstance(w, torch.Tensor) else w


def head_layer(weight: torch.Tensor, fmt: str, bias: torch.Tensor | None = None) -> WeightOnlyLinear:
    """The lm_head under `fmt` layers, in formats.head_format. Where the CPU kernels run, an int8 head is Q8_0
    blocks against x in two int8 parts (Q8HeadLinear), and so is an fp16 one whose weight Q8_0 holds exactly (a
    GGUF's Q8_0 embedding): half the bytes, no rounding of the weight."""
    from inferplug.kernels import cpu as cpu_kernels

    device = weight.device.type
    fmt = head_format(fmt, device)
    if cpu_kernels.runs_on(device):
        q8 = Q8HeadLinear.from_float(weight, bias)
        if fmt == "int8" or _holds_exactly(q8, weight):
            return q8
    return layer_class(fmt, device).from_float(weight, bias)


def _holds_exactly(layer: WeightOnlyLinear, weight: torch.Tensor, rows: int = 4096) -> bool:
    """Whether `layer`'s values are `weight`'s, compared a few rows at a time (a head's whole fp32 copy, twice, would
    be 5 GB at a 152k vocabulary)."""
    return all(torch.equal(layer.rows(torch.arange(start, min(start + rows, len(weight)))),
                           weight[start:start + rows].float()) for start in range(0, len(weight), rows))


def _swap_linears(module: nn.Module, fmt: str, layer_cls: type[WeightOnlyLinear]) -> None:
    for name, child in module.named_children():
        if type(child) is not nn.Linear:
            _swap_linears(child, fmt, layer_cls)
        elif name == "lm_head":
            setattr(module, name, head_layer(child.weight, fmt, child.bias))
        else:
            setattr(module, name, layer_cls.from_float(child.weight, child.bias))
