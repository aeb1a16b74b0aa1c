"""Layers that run an AWQ / GPTQ checkpoint's int4 groups (quant/group_int4.py) without dequantizing the model.

- CPU with inferplug's kernels: repacked at load into the engine's Q4_1 blocks (Q4Linear; Q4G128Linear for groups
  of 128, which stores each group's scale and min once: 4.25 bits a weight). A group of G inputs with scale s and
  zero z is G / 32 blocks of 32 with scale s and min -s*z: w = q*s - s*z. The scale is the
  checkpoint's fp16 exactly; the min is rounded to fp16 (at most 2^-12 * 15 * s off, under 0.4% of one
  quantization step), the one inexact part. GPTQ at 8 bits, symmetric (z = 128), is Q8_0 blocks (Q8Linear) of
  int8 q - 128 with scale s: exact.
- Elsewhere (CUDA; a CPU without the kernels): GroupInt4Linear keeps the checkpoint's groups (4 bits a weight plus
  an fp16 scale and a uint8 zero a group) and runs the Triton dequant-GEMM on CUDA, its torch reference on the CPU.
- Act-order (GPTQ desc_act): the inputs are permuted once at load so each group is contiguous, and
  PermutedLinear permutes the activations at run time the same way (CPU decode: inside decode_layers' call).
  down_proj's permutation needs no run time at all: `fold_down_order` permutes gate/up's output rows instead.
Fused projections (q/k/v, gate/up) concatenate their layers' output rows: `fuse_rows`.
"""

from __future__ import annotations

import torch

from inferplug.errors import ProfileError
from inferplug.quant.base import WeightOnlyLinear
from inferplug.quant.block_linear import BLOCK, BlockLinear, Q4G128Linear, Q4Linear, Q8Linear
from inferplug.quant.group_int4 import GroupQuant


def checkpoint_layer(quant: GroupQuant, device: str, bias: torch.Tensor | None = None) -> WeightOnlyLinear:
    """The layer that runs `quant` on `device` (the loader's one entry point)."""
    from inferplug.kernels import cpu as cpu_kernels

    order = quant.input_order()
    if order is not None:
        quant = quant.permuted(order)
    on_kernels = cpu_kernels.runs_on(device)
    if quant.bits == 8:
        if not on_kernels:
            raise ProfileError("8-bit GPTQ runs on inferplug's CPU kernels only (as Q8_0 blocks), and this device "
                               "has none; use the model's 4-bit GPTQ or AWQ checkpoint here")
        layer = q8_layer(quant, bias)
    elif on_kernels:
        layer = q4_layer(quant, bias)
    else:
        layer = GroupInt4Linear.from_quant(quant, device, bias)
    return layer if order is None else PermutedLinear(layer, order.to(device))


def q4_layer(quant: GroupQuant, bias: torch.Tensor | None = None) -> Q4Linear:
    """Q4_1 blocks holding `quant` (its groups contiguous): groups of 128 keep one scale and min a group
    (Q4G128Linear), other sizes repeat them in each block."""
    scale, low = quant.scales.half(), (-(quant.scales.float() * quant.zeros.float())).half()
    if quant.group_size == 4 * BLOCK:
        cls = Q4G128Linear
    else:
        cls, scale, low = Q4Linear, _per_block(scale, quant), _per_block(low, quant)
    # quant.packed is already Q4Linear's nibble order (byte j: input j low, input j + 16 high)
    return cls.from_fields(scale.unsqueeze(-1).view(torch.uint8), low.unsqueeze(-1).view(torch.uint8), quant.packed,
                           bias=bias)


def q8_layer(quant: GroupQuant, bias: torch.Tensor | None = None) -> Q8Linear:
    """Q8_0 blocks holding a symmetric 8-bit `quant` (its groups contiguous): (q - 128) * s exactly."""
    if not bool((quant.zeros == 128).all()):
        raise ProfileError("this 8-bit GPTQ checkpoint is asymmetric (zeros other than 128), which the CPU's Q8_0 "
                           "blocks (a scale, no min) cannot hold; use one quantized with sym = true (GPTQModel's "
                           "default) or a 4-bit checkpoint")
    scale = _per_block(quant.scales.half(), quant)
    q = (quant.codes ^ 0x80).reshape(quant.codes.shape[0], -1, BLOCK)  # the bytes of int8 q - 128
    return Q8Linear.from_fields(scale.unsqueeze(-1).view(torch.uint8), q, bias=bias)


def _per_block(group_values: torch.Tensor, quant: GroupQuant) -> torch.Tensor:
    """[out, groups] -> [out, 32-input blocks]: each group's value for each of its blocks (its groups contiguous)."""
    if quant.group_size % BLOCK:
        raise ProfileError(f"group_size {quant.group_size} is not a multiple of 32, so the CPU's 32-input blocks "
                           "cannot hold it; use a checkpoint quantized with group_size 32, 64 or 128")
    rows, groups = group_values.shape
    return group_values.unsqueeze(-1).expand(rows, groups, quant.group_size // BLOCK).reshape(rows, -1)


class GroupInt4Linear(WeightOnlyLinear):
    """The checkpoint's int4 groups as the Triton kernel reads them (kernels/int4_gemm_ref.py's layout)."""

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int,
                 bias: torch.Tensor | None = None):  # fmt: skip
        super().__init__()
        self.in_features, self.out_features = qweight.shape[0] * 8, qweight.shape[1]
        self.group_size = group_size
        self.compute_dtype = scales.dtype
        self.register_buffer("qweight", qweight)  # int32 [in / 8, out]
        self.register_buffer("scales", scales)  # [in / G, out], the compute dtype
        self.register_buffer("zeros", zeros)  # uint8 [in / G, out]
        self.register_buffer("bias", None if bias is None else bias.to(scales.dtype))

    @classmethod
    def from_quant(cls, quant: GroupQuant, device: str, bias: torch.Tensor | None = None) -> "GroupInt4Linear":
        from inferplug.kernels.int4_gemm_ref import pack_rows

        dtype = torch.float16 if device.startswith("cuda") else torch.float32
        return cls(pack_rows(quant.codes.t()).to(device), quant.scales.t().to(device, dtype).contiguous(),
                   quant.zeros.t().contiguous().to(device, torch.uint8), quant.group_size, bias)

    def dequantized(self) -> torch.Tensor:
        from inferplug.kernels.int4_gemm_ref import dequantize

        return dequantize(self.qweight, self.scales, self.zeros, self.group_size).t()

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            from inferplug.kernels.int4_gemm import int4_gemm

            return int4_gemm(x, self.qweight, self.scales, self.zeros, self.group_size)
        from inferplug.kernels.int4_gemm_ref import int4_gemm_ref

        return int4_gemm_ref(x, self.qweight, self.scales, self.zeros, self.group_size)

    def fused(self, others: list["GroupInt4Linear"]) -> "GroupInt4Linear":
        layers = [self, *others]
        cat = [torch.cat([getattr(layer, name) for layer in layers], dim=1) for name in ("qweight", "scales", "zeros")]
        return GroupInt4Linear(*cat, self.group_size)


class PermutedLinear(WeightOnlyLinear):
    """An act-order layer: its inputs permuted (`order`) at load, so its activations are too, at run time."""

    def __init__(self, inner: WeightOnlyLinear, order: torch.Tensor):
        super().__init__()
        self.inner, self.in_features, self.out_features = inner, inner.in_features, inner.out_features
        self.register_buffer("order", order)
        self.bias = None

    def forward(self, x: torch.Tensor, decode_rows: int | None = None) -> torch.Tensor:
        return self.inner.forward(x.index_select(-1, self.order), decode_rows)

    def dequantized(self) -> torch.Tensor:
        return self.inner.dequantized()[:, self.order.argsort()]

    def nbytes(self) -> int:
        return self.inner.nbytes() + self.order.nbytes


def fuse_rows(parts: list) -> torch.Tensor | WeightOnlyLinear:
    """q/k/v or gate/up as one weight: float tensors concatenated, or the layers' output rows concatenated. Block
    layers of different formats (a Q4_K_M GGUF's Q6_K attn_v beside Q4_K q/k) keep their own: each run
    of one format fused, the runs side by side (RowPartsLinear)."""
    if all(isinstance(p, torch.Tensor) for p in parts):
        return torch.cat(parts).contiguous()
    kinds = {type(p) for p in parts}
    if len(kinds) > 1 and all(isinstance(p, BlockLinear) and p.bias is None for p in parts):
        runs = [[parts[0]]]
        for part in parts[1:]:
            if type(part) is type(runs[-1][0]):
                runs[-1].append(part)
            else:
                runs.append([part])
        return RowPartsLinear([fuse_rows(run) for run in runs])
    if len(kinds) != 1 or any(getattr(p, "bias", None) is not None for p in parts):
        raise ProfileError("a fused projection mixes quantized and float (or biased) parts; quantize all of "
                           "q/k/v and gate/up alike (GPTQModel and AutoAWQ do by default)")
    first = parts[0]
    if isinstance(first, PermutedLinear):
        if any(not torch.equal(p.order, first.order) for p in parts):
            raise ProfileError("q/k/v (or gate/up) were quantized with different act-order permutations, so they "
                               "cannot share one input; re-quantize with desc_act = false")
        return PermutedLinear(fuse_rows([p.inner for p in parts]), first.order)
    if isinstance(first, BlockLinear):
        return type(first)(torch.cat([p.blocks for p in parts]))
    return first.fused(parts[1:])


class RowPartsLinear(WeightOnlyLinear):
    """Output rows computed by layers of different formats from one input, side by side: y = [part(x) for each]."""

    def __init__(self, parts: list[BlockLinear]):
        super().__init__()
        self.parts = torch.nn.ModuleList(parts)
        self.in_features, self.out_features = parts[0].in_features, sum(p.out_features for p in parts)
        self.compute_dtype, self.bias = parts[0].compute_dtype, None

    def forward(self, x: torch.Tensor, decode_rows: int | None = None) -> torch.Tensor:
        return torch.cat([part.forward(x, decode_rows) for part in self.parts], dim=-1)

    def dequantized(self) -> torch.Tensor:
        return torch.cat([part.dequantized() for part in self.parts])


def fold_down_order(gate_up, down) -> tuple:
    """(gate_up, down) with an act-order down's input permutation moved into gate_up's output rows. silu(gate) * up
    is element-wise, so gate and up rows taken in down's order hand down its inputs already permuted: no gather at
    run time. The same model, and on the CPU's decode kernels the same bits: they compute each output row on its
    own, so a row's value does not depend on where it sits."""
    if not isinstance(down, PermutedLinear):
        return gate_up, down
    return select_rows(gate_up, torch.cat([down.order, down.order + down.in_features])), down.inner


def select_rows(layer, rows: torch.Tensor):
    """The layer (or float weight) with its output rows `rows` (on its device), in that order (fuse_rows' layers
    have no bias)."""
    if isinstance(layer, torch.Tensor):
        return layer[rows].contiguous()
    if isinstance(layer, PermutedLinear):
        return PermutedLinear(select_rows(layer.inner, rows), layer.order)
    if isinstance(layer, BlockLinear):
        return type(layer)(layer.blocks[rows].contiguous())
    if isinstance(layer, GroupInt4Linear):
        return GroupInt4Linear(*(getattr(layer, name)[:, rows].contiguous() for name in ("qweight", "scales", "zeros")),
                               layer.group_size)
    raise ProfileError(f"an act-order down_proj follows a {type(layer).__name__} gate/up projection, whose rows the "
                       "native engine cannot reorder: quantize gate/up and down alike, or re-quantize with desc_act = false")
