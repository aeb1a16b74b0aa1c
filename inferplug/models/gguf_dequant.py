"""Vectorised torch dequantization of ggml block formats (legacy Q4/Q5/Q8, the K-quants and MXFP4).

Each function takes the raw bytes as a uint8 tensor of shape [n_blocks, block_bytes] and returns
float32 values of shape [n_blocks, block_elements]. Arithmetic follows ggml's reference
`dequantize_row_*` (and gguf-py's numpy port) step by step, unfused, so results are bit-identical
to what transformers' GGUF loader produces. Block layouts: ggml/src/ggml-common.h.
"""

from __future__ import annotations

import torch

from inferplug.quant.block_linear import MXFP4_VALUES

QK_K = 256  # elements per K-quant super-block


def _f16(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The little-endian fp16 at byte `start` of every block, as float32 [n_blocks, 1]."""
    return blocks[:, start : start + 2].contiguous().view(torch.float16).to(torch.float32)


def _unpack(packed: torch.Tensor, group: int, shifts: list[int], mask: int) -> torch.Tensor:
    """Split each run of `group` bytes into len(shifts) runs of bit-fields: [n, k] -> [n, k*len(shifts)].

    ggml lays quants out as "all low fields of these `group` bytes, then all the next fields", so the
    shift axis sits between the run index and the byte index. Scalar shifts, one op each: torch
    vectorises those, while a broadcast tensor shift on uint8 runs ~7x slower.
    """
    runs = packed.reshape(packed.shape[0], -1, group)
    return torch.stack([(runs >> shift) & mask for shift in shifts], dim=2).reshape(packed.shape[0], -1)


def _high_bits(qh: torch.Tensor) -> torch.Tensor:
    """The 32 bits of a little-endian uint32 per block, bit i at column i: [n, 4] -> [n, 32] (Q5_0/Q5_1)."""
    return torch.stack([(qh >> bit) & 1 for bit in range(8)], dim=2).reshape(qh.shape[0], 32)


def dequant_q4_0(blocks: torch.Tensor) -> torch.Tensor:
    d = _f16(blocks, 0)
    q = _unpack(blocks[:, 2:], 16, [0, 4], 0x0F).to(torch.int8) - 8
    return d * q.to(torch.float32)


def q5_0_codes(blocks: torch.Tensor) -> torch.Tensor:
    """A Q5_0 block's 32 signed codes q - 16 (int8, in -16..15): its values are d * codes."""
    low = _unpack(blocks[:, 6:], 16, [0, 4], 0x0F)
    return (low | (_high_bits(blocks[:, 2:6]) << 4)).to(torch.int8) - 16


def dequant_q4_1(blocks: torch.Tensor) -> torch.Tensor:
    d, m = _f16(blocks, 0), _f16(blocks, 2)
    q = _unpack(blocks[:, 4:], 16, [0, 4], 0x0F).to(torch.float32)
    return d * q + m


def dequant_q5_0(blocks: torch.Tensor) -> torch.Tensor:
    return _f16(blocks, 0) * q5_0_codes(blocks).to(torch.float32)


def dequant_q5_1(blocks: torch.Tensor) -> torch.Tensor:
    d, m = _f16(blocks, 0), _f16(blocks, 2)
    low = _unpack(blocks[:, 8:], 16, [0, 4], 0x0F)
    q = (low | (_high_bits(blocks[:, 4:8]) << 4)).to(torch.float32)
    return d * q + m


def dequant_q8_0(blocks: torch.Tensor) -> torch.Tensor:
    d = _f16(blocks, 0)
    return blocks[:, 2:].contiguous().view(torch.int8).to(torch.float32) * d


def dequant_q2_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    scales, qs = blocks[:, :16], blocks[:, 16:80]
    d, dmin = _f16(blocks, 80), _f16(blocks, 82)
    dl = (d * (scales & 0x0F).to(torch.float32)).view(n, 16, 1)
    ml = (dmin * (scales >> 4).to(torch.float32)).view(n, 16, 1)
    q = _unpack(qs, 32, [0, 2, 4, 6], 0x03).view(n, 16, 16).to(torch.float32)
    return (dl * q - ml).view(n, QK_K)


def dequant_q3_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    hmask, qs, packed_scales = blocks[:, :32], blocks[:, 32:96], blocks[:, 96:108]
    d = _f16(blocks, 108)
    low = _unpack(packed_scales[:, :8], 8, [0, 4], 0x0F)
    high = _unpack(packed_scales[:, 8:], 4, [0, 2, 4, 6], 0x03)
    scales = ((low | (high << 4)).to(torch.int8) - 32).to(torch.float32)
    dl = (d * scales).view(n, 16, 1)
    ql = _unpack(qs, 32, [0, 2, 4, 6], 0x03).view(n, 16, 16)
    qh = _unpack(hmask, 32, list(range(8)), 0x01).view(n, 16, 16) ^ 1  # a set bit means "no -4 offset"
    q = (ql.to(torch.int8) - (qh << 2).to(torch.int8)).to(torch.float32)
    return (dl * q).view(n, QK_K)


def _k_scale_min(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The eight 6-bit scale and min codes (uint8 [n, 8]) of a Q4_K/Q5_K super-block, from its 12 packed bytes."""
    d, m, m_d = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scale = torch.cat([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], dim=1)
    minimum = torch.cat([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], dim=1)
    return scale, minimum


def q4_k_parts(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A Q4_K super-block's 8 sub-blocks of 32: scale and min codes sc, m (uint8 [n, 8]) and weight codes q
    (uint8 [n, 8, 32]); its values are d * sc * q - dmin * m, with d and dmin the fp16 at bytes 0 and 2."""
    scale, minimum = _k_scale_min(blocks[:, 4:16])
    return scale, minimum, _unpack(blocks[:, 16:], 32, [0, 4], 0x0F).view(blocks.shape[0], 8, 32)


def q5_k_parts(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """As q4_k_parts for a Q5_K super-block: its weight codes q (uint8 [n, 8, 32]) are 0..31."""
    n = blocks.shape[0]
    scale, minimum = _k_scale_min(blocks[:, 4:16])
    low = _unpack(blocks[:, 48:], 32, [0, 4], 0x0F).view(n, 8, 32)
    high = _unpack(blocks[:, 16:48], 32, list(range(8)), 0x01).view(n, 8, 32)
    return scale, minimum, low | (high << 4)


def dequant_q4_k(blocks: torch.Tensor, parts=q4_k_parts) -> torch.Tensor:
    n = blocks.shape[0]
    scale, minimum, q = parts(blocks)
    dl, ml = (_f16(blocks, 0) * scale).view(n, 8, 1), (_f16(blocks, 2) * minimum).view(n, 8, 1)
    return (dl * q.to(torch.float32) - ml).view(n, QK_K)


def dequant_q5_k(blocks: torch.Tensor) -> torch.Tensor:
    return dequant_q4_k(blocks, q5_k_parts)


def q6_k_parts(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A Q6_K super-block's 16 sub-blocks of 16: their scales (int8 [n, 16]) and codes q (uint8 [n, 256], 0..63);
    its values are d * scale * (q - 32), with d the fp16 at byte 208."""
    n = blocks.shape[0]
    low = _unpack(blocks[:, :128], 64, [0, 4], 0x0F).view(n, -1, 32)
    high = _unpack(blocks[:, 128:192], 32, [0, 2, 4, 6], 0x03).view(n, -1, 32)
    return blocks[:, 192:208].contiguous().view(torch.int8), (low | (high << 4)).view(n, QK_K)


def dequant_q6_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    scales, codes = q6_k_parts(blocks)
    dl = (_f16(blocks, 208) * scales.to(torch.float32)).view(n, 16, 1)
    q = (codes.to(torch.int8) - 32).view(n, 16, 16).to(torch.float32)
    return (dl * q).view(n, QK_K)


def mxfp4_parts(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An MXFP4 block's exponent byte e (int32 [n]) and its 32 values as int8 codes (MXFP4_VALUES, [n, 32]): its
    values are codes * 2^(e - 128)."""
    nibbles = _unpack(blocks[:, 1:], 16, [0, 4], 0x0F)
    return blocks[:, 0].to(torch.int32), MXFP4_VALUES[nibbles.long()]


def mxfp4_scale(e: torch.Tensor) -> torch.Tensor:
    """2^(e - 128) in float32, exactly as ggml's ggml_e8m0_to_fp32_half (e of 0 and 1 give subnormals)."""
    bits = torch.where(e < 2, 0x00200000 << e.clamp(max=1), (e - 1) << 23)
    return bits.to(torch.int32).view(torch.float32)


def dequant_mxfp4(blocks: torch.Tensor) -> torch.Tensor:
    e, codes = mxfp4_parts(blocks)
    return mxfp4_scale(e)[:, None] * codes.to(torch.float32)


BLOCK_DEQUANTIZERS = {
    "Q4_0": dequant_q4_0,
    "Q4_1": dequant_q4_1,
    "Q5_0": dequant_q5_0,
    "Q5_1": dequant_q5_1,
    "Q8_0": dequant_q8_0,
    "Q2_K": dequant_q2_k,
    "Q3_K": dequant_q3_k,
    "Q4_K": dequant_q4_k,
    "Q5_K": dequant_q5_k,
    "Q6_K": dequant_q6_k,
    "MXFP4": dequant_mxfp4,
}
_FLOAT_TYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def dequantize(raw: torch.Tensor, type_name: str, shape: tuple[int, ...], block_bytes: int) -> torch.Tensor:
    """Raw uint8 bytes of one tensor -> its values in float32 (or its own float type), shaped `shape`."""
    if type_name in _FLOAT_TYPES:
        return raw.view(_FLOAT_TYPES[type_name]).view(shape)
    values = BLOCK_DEQUANTIZERS[type_name](raw.view(-1, block_bytes))
    return values.view(shape)
