"""llama.cpp's K-quant block formats as a GGUF stores them (quant/block_linear.py's BlockLinear for each): Q4_K and
Q5_K (fp16 d and dmin per super-block of 256 inputs, 6-bit scale and min codes per block of 32) and Q6_K (an fp16 d
per super-block, an int8 scale per 16 inputs, 6-bit codes), so a Q4_K_M or Q5_K_M file runs in its own bits; and
Q5_0 (an fp16 scale per 32 inputs over Q5_K's 5-bit codes), the K-quants' fallback for rows that are not whole
super-blocks (Gemma's 640- and 2816-wide ones). The kernels read the same layouts (kernels/cpu/block_formats.h)."""

from __future__ import annotations

import torch

from inferplug.quant.block_linear import BlockLinear, fp16_floats


class Q4KLinear(BlockLinear):
    """Q4Linear's nibbles under llama.cpp's Q4_K scales, so a Q4_K weight runs as stored: per 8 blocks (a super-block
    of 256 inputs) fp16 d and dmin, per block 6-bit codes sc and m (a byte each); w = d * sc * q - dmin * m.
    4.625 bits a weight (Q4_K's own 4.5 packs the codes 6 bits each), against Q4_1's 5."""

    fields, spans = (2, 2, 1, 1, 16), (8, 8, 1, 1, 1)  # d, dmin, sc, m, nibbles
    kernel, prefill, unpack = "q4_k_matmul", "q4_k_prefill_matmul", "q4_k_dequantize"
    levels = 15  # the largest weight code q

    @classmethod
    def _pack(cls, groups):
        """Q4_K's own rounding, simplified: each block's Q4_1 range, its scale and min (a min above zero is zero)
        as 6-bit codes of its super-block's largest."""
        out, blocks = groups.shape[:2]
        low = groups.amin(dim=-1, keepdim=True).clamp(max=0)  # [out, blocks, 1]

        def as_codes(value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            """[out, blocks, 1] -> (the super-blocks' fp16 top [out, blocks / 8, 1], each block's 6-bit code)."""
            top = (value.reshape(out, blocks // 8, 8).amax(dim=-1, keepdim=True) / 63).half()
            return top, torch.round(value / _per_block(top).clamp(min=1e-10)).clamp(0, 63)

        d, sc = as_codes((groups.amax(dim=-1, keepdim=True) - low) / cls.levels)
        dmin, m = as_codes(-low)
        step, offset = _per_block(d) * sc, _per_block(dmin) * m
        q = torch.round((groups + offset) / step.clamp(min=1e-10)).clamp(0, cls.levels).to(torch.uint8)
        return d.view(torch.uint8), dmin.view(torch.uint8), sc.to(torch.uint8), m.to(torch.uint8), cls.pack_codes(q)

    @classmethod
    def _unpack(cls, d, dmin, sc, m, quants):
        return cls.codes(quants).float() * (_per_block(d) * sc.float()) + -(_per_block(dmin) * m.float())

    @staticmethod
    def pack_codes(q: torch.Tensor) -> torch.Tensor:
        """Codes [..., 32] -> a block's quant bytes: Q4Linear's nibbles (byte j: input j low, input j + 16 high)."""
        return q[..., :16] | (q[..., 16:] << 4)

    @staticmethod
    def codes(quants: torch.Tensor) -> torch.Tensor:
        """The inverse of pack_codes."""
        return torch.cat([quants & 15, quants >> 4], dim=-1)


class Q5KLinear(Q4KLinear):
    """llama.cpp's Q5_K as stored, so a Q5_K_M file runs in its own bits: Q4KLinear's scales (fp16 d and dmin per
    super-block, 6-bit sc and m per block) over 5-bit codes q (0..31); w = d * sc * q - dmin * m. A block's quants:
    Q4Linear's 16 bytes of low nibbles, then a word of high bits (kernels/cpu/block_formats.h's Q5_K). 5.625 bits a
    weight (the file's 5.5 packs the codes 6 bits each), against the Q8_0 requantization's 8.5."""

    fields = (2, 2, 1, 1, 20)  # d, dmin, sc, m, quants
    kernel, prefill, unpack = "q5_k_matmul", "q5_k_prefill_matmul", "q5_k_dequantize"
    levels = 31

    @staticmethod
    def pack_codes(q):
        """Codes 0..31 [..., 32] -> 20 bytes: low nibbles as Q4Linear's, then byte i of the high word holding input
        4k + i's high bit in bit k and input 16 + 4k + i's in bit 4 + k (k = 0..3)."""
        high = (q >> 4).reshape(*q.shape[:-1], 2, 4, 4)  # [..., half, k, i]
        word = sum(high[..., h, k, :] << (4 * h + k) for h in range(2) for k in range(4))
        return torch.cat([Q4KLinear.pack_codes(q & 15), word], dim=-1)

    @staticmethod
    def codes(quants):
        word = quants[..., 16:].unsqueeze(-2)  # [..., 1, 4]: byte i
        high = torch.cat([(word >> (4 * h + k)) & 1 for h in range(2) for k in range(4)], dim=-2)
        return Q4KLinear.codes(quants[..., :16]) | (high.reshape(*quants.shape[:-1], 32) << 4)


class Q5_0Linear(BlockLinear):
    """llama.cpp's Q5_0 as stored: per block of 32 inputs an fp16 d and 5-bit codes q (0..31) in Q5KLinear's quant
    bytes; w = d * (q - 16). 5.5 bits a weight, as the file's, against the Q8_0 it ran as before (exact, 8.5)."""

    fields = (2, 20)  # d, quants
    kernel, prefill, unpack = "q5_0_matmul", "q5_0_prefill_matmul", "q5_0_dequantize"

    @staticmethod
    def _pack(groups):
        """llama.cpp's quantize_row_q5_0_ref: d = the block's value of largest magnitude / -16, q = x / d + 16 rounded
        half up (the inverse from d before its fp16 rounding), at most 31."""
        extreme = groups.gather(-1, groups.abs().argmax(dim=-1, keepdim=True))  # [out, blocks, 1]
        d = extreme / -16
        inverse = torch.where(d != 0, 1 / d, torch.zeros_like(d))
        q = torch.floor(groups * inverse + 16.5).clamp(0, 31).to(torch.uint8)
        return d.half().view(torch.uint8), Q5KLinear.pack_codes(q)

    @staticmethod
    def _unpack(d, quants):
        return (Q5KLinear.codes(quants).float() - 16) * fp16_floats(d)


class Q6KLinear(BlockLinear):
    """llama.cpp's Q6_K as stored, so a Q4_K_M's Q6_K tensors run in their own bits: per 8 blocks (a super-block of
    256 inputs) an fp16 d, per 16 inputs an int8 scale sc, per input a 6-bit code q; w = d * sc * (q - 32). A block's
    quants: Q4Linear's 16 bytes of low nibbles, then two words of high bit pairs (kernels/cpu/quant_dot.h's Q6_K).
    6.5625 bits a weight, as the file's, against the Q8_0 requantization's 8.5."""

    fields, spans = (2, 1, 1, 24), (8, 1, 1, 1)  # d, sc of inputs 0..15, sc of 16..31, quants
    kernel, prefill, unpack = "q6_k_matmul", "q6_k_prefill_matmul", "q6_k_dequantize"

    @staticmethod
    def _pack(groups):
        """Q6_K's rounding, simplified: each 16 inputs' scale max |w| / 31 as an int8 code of its super-block's d."""
        out, blocks = groups.shape[:2]
        scale = groups.reshape(out, blocks, 2, 16).abs().amax(dim=-1) / 31  # [out, blocks, 2]
        d = (scale.reshape(out, blocks // 8, 16).amax(dim=-1, keepdim=True) / 127).half()  # [out, blocks / 8, 1]
        sc = torch.round(scale / _per_block(d).clamp(min=1e-10)).clamp(-128, 127)
        step = (_per_block(d) * sc).repeat_interleave(16, dim=-1)  # [out, blocks, 32]
        codes = (torch.round(groups / step.clamp(min=1e-10)).clamp(-32, 31) + 32).to(torch.uint8)
        sc = sc.to(torch.int8).view(torch.uint8)
        return d.view(torch.uint8), sc[..., :1], sc[..., 1:], pack_six_bits(codes)

    @staticmethod
    def _unpack(d, sc_low, sc_high, quants):
        sc = torch.cat([sc_low, sc_high], dim=-1).view(torch.int8).float().repeat_interleave(16, dim=-1)
        return (six_bit_codes(quants).float() - 32) * (_per_block(d) * sc)


class Q6KHeadLinear(Q6KLinear):
    """A GGUF's Q6_K lm_head (Q4_K_M's and Q5_K_M's) in its own bits, x going in as two int8 parts as
    Q8HeadLinear's: 23% fewer bytes than the Q8_0 it was requantized to before, and the file's values exactly."""

    kernel = "q6_k_head_matmul"


def pack_six_bits(codes: torch.Tensor) -> torch.Tensor:
    """Codes 0..63 [..., 32] -> Q6KLinear's 24 quant bytes: low nibbles as Q4Linear's (byte j: input j, j + 16), then
    byte i of word h (h = 0, 1) holding input 16h + 4k + i's high bit pair in bits 2k, 2k + 1 (k = 0..3)."""
    low, high = codes & 15, codes >> 4
    pairs = high.reshape(*codes.shape[:-1], 2, 4, 4)  # [..., h, k, i]
    words = sum(pairs[..., k, :] << (2 * k) for k in range(4)).reshape(*codes.shape[:-1], 8)
    return torch.cat([low[..., :16] | (low[..., 16:] << 4), words], dim=-1)


def six_bit_codes(quants: torch.Tensor) -> torch.Tensor:
    """The inverse of pack_six_bits: [..., 24] -> codes [..., 32]."""
    nibbles, words = quants[..., :16], quants[..., 16:].reshape(*quants.shape[:-1], 2, 1, 4)
    high = torch.cat([(words >> (2 * k)) & 3 for k in range(4)], dim=-2).reshape(*quants.shape[:-1], 32)
    return torch.cat([nibbles & 15, nibbles >> 4], dim=-1) | (high << 4)


def _per_block(halves: torch.Tensor) -> torch.Tensor:
    """A super-block field (fp16 bytes [out, blocks / 8, 2], or floats [out, blocks / 8, 1]) as floats per block."""
    values = halves.float() if halves.dtype == torch.float16 else fp16_floats(halves)
    return values.repeat_interleave(8, dim=1)
