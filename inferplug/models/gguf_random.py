"""Random but well-formed GGUF blocks of any type, at a chosen spread: the dummy load format's weights and the
tests' inputs (gguf-py quantizes no K-quant, so those are made from random bytes with sane fp16 scales)."""

from __future__ import annotations

import math

import torch

from inferplug.models.gguf import GGML_TYPES
from inferplug.models.gguf_dequant import dequantize

# Each type's fp16 fields: (byte offset of the scale d, byte offset of the min or None, the min as a multiple of d
# that centres the values: the codes' mean times the sub-scales' mean over the mins' mean).
_FP16_FIELDS = {
    "Q4_0": (0, None, 0.0), "Q5_0": (0, None, 0.0), "Q8_0": (0, None, 0.0),
    "Q4_1": (0, 2, -7.5), "Q5_1": (0, 2, -15.5),
    "Q2_K": (80, 82, 1.5), "Q3_K": (108, None, 0.0), "Q4_K": (0, 2, 7.5), "Q5_K": (0, 2, 15.5), "Q6_K": (208, None, 0.0),
}
RANDOM_TYPES = (*_FP16_FIELDS, "MXFP4")


def random_blocks(type_name: str, shape: tuple[int, int], std: float, generator: torch.Generator) -> torch.Tensor:
    """uint8 [rows, row bytes] of `type_name` blocks whose values have about mean 0 and standard deviation `std`."""
    rows, cols = shape
    _, block_elems, block_bytes = GGML_TYPES[type_name]
    raw = torch.randint(0, 256, (rows * cols // block_elems, block_bytes), dtype=torch.uint8, generator=generator)
    if type_name == "MXFP4":
        return _random_mxfp4(raw, std, generator).reshape(rows, -1)
    scale_at, min_at, min_per_scale = _FP16_FIELDS[type_name]
    d = torch.empty(raw.shape[0], 1).uniform_(0.5, 1.0, generator=generator)

    def set_fields(d: torch.Tensor) -> None:
        raw[:, scale_at:scale_at + 2] = d.half().view(torch.uint8)
        if min_at is not None:
            raw[:, min_at:min_at + 2] = (d * min_per_scale).half().view(torch.uint8)

    set_fields(d)
    sample = min(raw.shape[0], 4096)
    spread = dequantize(raw[:sample].reshape(-1), type_name, (sample * block_elems,), block_bytes).std().item()
    set_fields(d * (std / spread))
    return raw.reshape(rows, -1)


def _random_mxfp4(raw: torch.Tensor, std: float, generator: torch.Generator) -> torch.Tensor:
    """MXFP4 blocks (an E8M0 exponent byte, then the codes) of spread `std`: each block's exponent one of two
    neighbours, in the share that gives the spread (a power of two alone would miss it by up to a factor of 1.4)."""
    raw[:, 0] = 128  # scale 1
    unit = dequantize(raw[:4096].reshape(-1), "MXFP4", (min(raw.shape[0], 4096) * 32,), 17).std().item()
    base = math.floor(math.log2(std / unit))
    upper = ((std / unit / 2**base) ** 2 - 1) / 3  # the share at base + 1: (1 - p) + 4 p = (std / (unit 2^base))^2
    raw[:, 0] = 128 + base + (torch.rand(raw.shape[0], generator=generator) < upper).to(torch.uint8)
    return raw


def q4_k_m_type(gguf_name: str, layer: int, num_layers: int, base: str = "Q4_K") -> str:
    """The ggml type llama.cpp's Q4_K_M gives a tensor (llama-quant.cpp): Q6_K for the output, and for attn_v and
    ffn_down (an MoE's ffn_down_exps too) in the layers `use_more_bits` picks (the first and last eighth, every third
    between); `base` elsewhere."""
    more_bits = layer < num_layers // 8 or layer >= 7 * num_layers // 8 or (layer - num_layers // 8) % 3 == 2
    if gguf_name == "output.weight" or (more_bits and (".attn_v." in gguf_name or ".ffn_down" in gguf_name)):
        return "Q6_K"
    return base


def q5_k_m_type(gguf_name: str, layer: int, num_layers: int) -> str:
    """Q5_K_M's: Q4_K_M's mix with Q5_K where that has Q4_K (llama-quant.cpp gives both the same Q6_K tensors)."""
    return q4_k_m_type(gguf_name, layer, num_layers, "Q5_K")

