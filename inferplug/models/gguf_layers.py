"""One GGUF tensor straight into the layer that runs it (quant/block_linear.py), a few rows at a time: no float
copy of a quantized weight is ever whole.

Under quantization.format = "gguf" a tensor runs in its own bits where our blocks hold them (quant/formats.py
gguf_layer_format picks the block):
- Q4_1 and Q8_0: the file's bytes, reordered into our field-by-field rows.
- Q4_0 as Q4_1 exactly: d * (q - 8) = d * q + (-8 d), and -8 d is exact in fp16.
- Q5_0 as Q5_0 blocks (Q5_0Linear): its d and 5-bit codes, exactly, in the file's 5.5 bits (pinned "int8": as Q8_0,
  exactly: its codes q - 16 fit int8, with the same scale).
- MXFP4 (gpt-oss's experts) as MXFP4 blocks (MXFP4Linear): its codes as they are, its E8M0 scale 2^(e - 128) as
  an fp16, exact for e - 128 in [-24, 15] (below, a block's values are all under 4e-7 and its scale rounds), 4.5
  bits a weight. Pinned "int8": the same values as Q8_0 blocks (E2M1's values doubled are the int8 codes 0, ±1, ...,
  ±12).
- Q4_K as Q4_K blocks (Q4KLinear): its d, dmin, 6-bit codes and nibbles, exactly (the codes a byte each).
- Q5_K as Q5_K blocks (Q5KLinear): its d, dmin, 6-bit codes (a byte each) and 5-bit codes, exactly.
- Q6_K as Q6_K blocks (Q6KLinear): its d, int8 scales and 6-bit codes, exactly, in as many bytes.
- Q5_1, Q2_K, Q3_K (and Q5_K / Q6_K pinned to int8) as Q8_0, requantized from their values: at most half a Q8_0 step (max |w| / 254
  per 32 weights) off, a small fraction of the source's own step.
Pinned "int4" / "int8" use the exact repacks where the source allows and requantize otherwise; a head is
Q6KHeadLinear where the file's is Q6_K under "gguf", else Q8HeadLinear (Q8_0), both taking x in two int8 parts.
tests/models/test_gguf_layers.py checks each case against gguf-py.
"""

from __future__ import annotations

import torch

from inferplug.errors import ModelSourceError
from inferplug.models.gguf import GGML_TYPES
from inferplug.models.gguf_dequant import (dequantize, mxfp4_parts, mxfp4_scale, q4_k_parts, q5_0_codes, q5_k_parts,
                                          q6_k_parts)
from inferplug.quant.block_linear import (BlockLinear, MXFP4Linear, Q4Linear, Q8HeadLinear, Q8Linear,
                                          packed_in_row_runs)
from inferplug.quant.kquant_linear import Q4KLinear, Q5_0Linear, Q5KLinear, Q6KHeadLinear, Q6KLinear, pack_six_bits
from inferplug.quant.formats import GGUF_FLOAT_TYPES, gguf_layer_format


def is_quantized(type_name: str) -> bool:
    return type_name not in GGUF_FLOAT_TYPES


def gguf_layer(raw: torch.Tensor, type_name: str, shape: tuple[int, int], target: str, head: bool = False) -> BlockLinear:
    """The layer for one quantized GGUF weight: `raw` its bytes (uint8, rows in the file's order), `shape` (out, in)."""
    rows, cols = shape
    fmt = gguf_layer_format(type_name, target, head)
    cls = {"q6_k": Q6KHeadLinear, "int8": Q8HeadLinear}[fmt] if head else \
        {"int4": Q4Linear, "q4_k": Q4KLinear, "q5_0": Q5_0Linear, "q5_k": Q5KLinear, "q6_k": Q6KLinear,
         "mxfp4": MXFP4Linear, "int8": Q8Linear}[fmt]
    raw = raw.reshape(rows, -1)
    return cls(packed_in_row_runs(rows, cols, lambda start, end: _convert(raw[start:end], type_name, cols, cls)))


def mxfp4_scale_field(e: torch.Tensor) -> torch.Tensor:
    """MXFP4Linear's scale field (uint8 [n, 2], the fp16 2^(e - 128)) from n blocks' E8M0 bytes; ModelSourceError for
    a scale no weight has. Scales under 2^-24 round in fp16: their blocks' values are under 12 * 2^-25 (an all-zero
    block has e = 0)."""
    e = e.to(torch.int32)
    if (e > 128 + 15).any():
        raise ModelSourceError(f"an MXFP4 block's scale is 2^{int(e.max()) - 128}, no weight's: the file is corrupt; "
                               "re-download it")
    return mxfp4_scale(e).half()[:, None].view(torch.uint8)


def _convert(raw: torch.Tensor, type_name: str, cols: int, cls: type[BlockLinear]) -> torch.Tensor:
    """The blocks (uint8 [rows, bytes]) of `cls` holding these rows of a `type_name` tensor."""
    rows, block_bytes = raw.shape[0], GGML_TYPES[type_name][2]
    blocks = raw.reshape(-1, block_bytes)

    def fields(*parts: torch.Tensor) -> torch.Tensor:  # [n entries (of a block, or a super-block), bytes] each -> rows
        return cls.pack_fields(*(p.reshape(rows, -1, p.shape[-1]) for p in parts))

    if cls is Q4Linear and type_name == "Q4_1":
        return fields(blocks[:, 0:2], blocks[:, 2:4], blocks[:, 4:20])
    if cls is Q4Linear and type_name == "Q4_0":
        low = (-8 * blocks[:, 0:2].contiguous().view(torch.float16).float()).half()
        return fields(blocks[:, 0:2], low.view(torch.uint8), blocks[:, 2:18])
    if cls in (Q4KLinear, Q5KLinear):
        sc, m, codes = (q4_k_parts if cls is Q4KLinear else q5_k_parts)(blocks)
        return fields(blocks[:, 0:2], blocks[:, 2:4], sc.reshape(-1, 1), m.reshape(-1, 1), cls.pack_codes(codes))
    if cls is Q5_0Linear:
        return fields(blocks[:, 0:2], Q5KLinear.pack_codes((q5_0_codes(blocks) + 16).view(torch.uint8)))
    if issubclass(cls, Q6KLinear):
        scales, codes = q6_k_parts(blocks)
        scales = scales.view(torch.uint8).reshape(-1, 2)  # per block of 32: its two sub-blocks' scales
        return fields(blocks[:, 208:210], scales[:, :1], scales[:, 1:], pack_six_bits(codes.reshape(-1, 32)))
    if issubclass(cls, Q8Linear) and type_name == "Q8_0":
        return fields(blocks[:, 0:2], blocks[:, 2:34])
    if issubclass(cls, Q8Linear) and type_name == "Q5_0":
        return fields(blocks[:, 0:2], q5_0_codes(blocks).view(torch.uint8))
    if type_name == "MXFP4" and cls in (MXFP4Linear, Q8Linear):
        scale = mxfp4_scale_field(blocks[:, 0])  # the codes only for Q8: as int64 they are 16x the blocks' bytes
        return fields(scale, blocks[:, 1:17] if cls is MXFP4Linear else mxfp4_parts(blocks)[1].view(torch.uint8))
    values = dequantize(raw.reshape(-1), type_name, (rows, cols), block_bytes)
    return cls.from_float(values).blocks

