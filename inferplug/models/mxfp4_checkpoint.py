"""An HF checkpoint whose experts are MXFP4 (gpt-oss's release: quantization_config's quant_method "mxfp4").

Each MXFP4 weight is two tensors: `<name>_blocks` (uint8 [..., rows, in / 32, 16], two E2M1 codes a byte, the low
nibble first) and `<name>_scales` (uint8 [..., rows, in / 32], each block's E8M0 exponent). A value is
E2M1[code] * 2^(scale - 127), as transformers' integrations/mxfp4.py reads it; llama.cpp's converter moves the
codes into GGML's MXFP4 order, the same scale byte in front.

    mxfp4_weights(tensors, dtype, as_blocks) -> the pairs, kept as stored or dequantized as HF dequantizes them
    mxfp4_layer(blocks, scales)              -> one matrix's rows as an MXFP4Linear, in the file's bits
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from inferplug.errors import ModelSourceError
from inferplug.models.gguf_dequant import mxfp4_scale
from inferplug.models.gguf_layers import mxfp4_scale_field
from inferplug.quant.block_linear import MXFP4_VALUES, MXFP4Linear

if TYPE_CHECKING:
    from collections.abc import MutableMapping

BLOCKS, SCALES = "_blocks", "_scales"


def mxfp4_weights(tensors: "MutableMapping[str, torch.Tensor]", dtype: torch.dtype, as_blocks: bool) -> dict[str, Any]:
    """Pop every `<name>_blocks` / `<name>_scales` pair from `tensors`. `as_blocks` (the CPU kernels run MXFP4): the
    pair as stored, for the family to cut into its layers (mxfp4_layer); else `<name>` dequantized to `dtype` in HF's
    float layout ([..., in, rows]), as transformers gives it."""
    out = {}
    for name in sorted(n.removesuffix(BLOCKS) for n in tensors if n.endswith(BLOCKS)):
        if name + SCALES not in tensors:
            raise ModelSourceError(f"{name}{BLOCKS} has no {name}{SCALES}; the MXFP4 checkpoint is damaged or "
                                   "incomplete: re-download it")
        blocks, scales = tensors.pop(name + BLOCKS), tensors.pop(name + SCALES)
        if blocks.dtype != torch.uint8 or blocks.shape[-1] != 16 or scales.shape != blocks.shape[:-1]:
            raise ModelSourceError(f"{name}: MXFP4 blocks {tuple(blocks.shape)} ({blocks.dtype}) and scales "
                                   f"{tuple(scales.shape)} do not pair as [..., rows, in / 32, 16] uint8 and "
                                   "[..., rows, in / 32]: re-download the checkpoint")
        if as_blocks:
            out[name + BLOCKS], out[name + SCALES] = blocks, scales
        else:
            out[name] = _dequantized(blocks, scales).to(dtype).transpose(-1, -2).contiguous()
    if not out:
        raise ModelSourceError("the config says MXFP4 but the checkpoint has no *_blocks tensors: re-download it")
    return out


def mxfp4_layer(blocks: torch.Tensor, scales: torch.Tensor) -> MXFP4Linear:
    """Rows of an MXFP4 weight (blocks [rows, in / 32, 16], scales [rows, in / 32]) as the layer that runs them: the
    same codes and exponents, the codes in GGML's order (a block's first 16 in the low nibbles)."""
    codes = _codes(blocks)
    nibbles = codes[..., :16] | (codes[..., 16:] << 4)
    scale = mxfp4_scale_field(scales.reshape(-1)).reshape(*scales.shape, 2)
    return MXFP4Linear.from_fields(scale, nibbles)


def _codes(blocks: torch.Tensor) -> torch.Tensor:
    """A block's 32 codes in weight order: byte i holds weights 2i (low nibble) and 2i + 1."""
    return torch.stack([blocks & 15, blocks >> 4], dim=-1).flatten(-2)


def _dequantized(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float32 [..., rows, in]: GGML's doubled E2M1 values times 2^(e - 128), the same numbers as E2M1 times
    2^(e - 127)."""
    values = MXFP4_VALUES[_codes(blocks).long()].float() * mxfp4_scale(scales.to(torch.int32))[..., None]
    return values.flatten(-2)
