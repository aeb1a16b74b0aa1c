"""AWQ and GPTQ int4 (and GPTQ int8) checkpoints, unpacked bit for bit as AutoAWQ / GPTQModel pack them.

Both store w = (q - z) * s per group of `group_size` inputs, q and z 4-bit, s fp16, in int32 words of 8 nibbles
(the lowest nibble first; GPTQ at 8 bits: words of 4 bytes, the lowest byte first, the same layouts otherwise):
- AWQ GEMM: qweight [in, out / 8] packs 8 output columns in the order [0, 2, 4, 6, 1, 3, 5, 7] (AutoAWQ's
  AWQ_ORDER); qzeros [in / G, out / 8] likewise; scales [in / G, out].
- GPTQ: qweight [in / 8, out] packs 8 consecutive input rows; qzeros [groups, out / 8] packs 8 consecutive output
  columns; scales [groups, out]; g_idx [in] names each input's group (act-order / desc_act: not i // G). The v1
  format (GPTQ's, the default) stores z - 1, v2 stores z.
`GroupQuant` holds the codes in a torch Linear's orientation ([out, in]); the loader repacks it for the device
(models/quant_checkpoint.py). 4-bit codes stay two to a byte, in the CPU kernels' Q4 block order (`block_nibbles`):
each 32 inputs' byte j holds input j in its low nibble and input j + 16 in its high one. AWQ's and GPTQ's words
turn into those bytes with a few whole-tensor bit operations and one transpose (`_nibble_bytes`), with no byte per
weight in between: at 7B that is most of a first load's time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from inferplug.errors import ProfileError

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of an AWQ word holds column AWQ_ORDER[i] of its 8
AWQ_NIBBLE_OF_COLUMN = tuple(AWQ_ORDER.index(c) for c in range(8))
NIBBLES = 8
BLOCK, HALF = 32, 16  # `packed`'s byte j of each 32 inputs: input j (low nibble) and input j + 16 (high)
LOW_NIBBLES = 0x0F0F0F0F
HIGH_NIBBLES = 0xF0F0F0F0 - (1 << 32)  # as a signed int32
CHUNK_BLOCKS = 32  # 1024 inputs of a layer repacked at a time


@dataclass
class GroupQuant:
    """One linear layer's int4 (int8) codes and per-group scale and zero, [out, in] like its float weight."""

    packed: torch.Tensor  # 4 bits: uint8 [out, in / 32, 16] (block_nibbles); 8 bits: the codes, uint8 [out, in]
    scales: torch.Tensor  # fp16 [out, groups]
    zeros: torch.Tensor  # int16 [out, groups] (GPTQ v1's stored 255 reads as 256)
    g_idx: torch.Tensor  # int64 [in]: the group of each input
    bits: int = 4

    @property
    def codes(self) -> torch.Tensor:
        """uint8 [out, in], 0..15 (0..255): one byte a weight, for the slow paths (act-order, CUDA, tests)."""
        if self.bits == 8:
            return self.packed
        return torch.cat([self.packed & 15, self.packed >> 4], dim=-1).reshape(self.packed.shape[0], -1)

    @property
    def in_features(self) -> int:
        return self.packed.shape[1] * (BLOCK if self.bits == 4 else 1)

    @property
    def group_size(self) -> int:
        return self.in_features // self.scales.shape[1]

    def dequantized(self) -> torch.Tensor:
        """The float weight [out, in]: (q - z) * s, exact in fp32."""
        zeros, scales = self.zeros[:, self.g_idx].float(), self.scales[:, self.g_idx].float()
        return (self.codes.float() - zeros) * scales

    def input_order(self) -> torch.Tensor | None:
        """The input permutation that makes each group's inputs contiguous (act-order), None when they already are.
        ProfileError when g_idx does not give every group exactly group_size inputs."""
        n_in, groups = self.in_features, self.scales.shape[1]
        expected = torch.arange(n_in) // (n_in // groups)
        if torch.equal(self.g_idx, expected):
            return None
        order = torch.argsort(self.g_idx, stable=True)
        if not torch.equal(self.g_idx[order], expected):
            raise ProfileError(
                f"g_idx is not a permutation of {groups} groups of {n_in // groups} inputs (group sizes "
                f"{torch.bincount(self.g_idx.clamp(0, groups), minlength=groups).tolist()[:8]}...); the checkpoint "
                "is damaged or not GPTQ: re-download or re-quantize it"
            )
        return order

    def permuted(self, order: torch.Tensor) -> GroupQuant:
        """The same layer with its inputs in `order` (then g_idx is i // group_size)."""
        codes = self.codes[:, order]
        return GroupQuant(codes.contiguous() if self.bits == 8 else block_nibbles(codes), self.scales, self.zeros,
                          torch.arange(self.in_features) // self.group_size, self.bits)


def block_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes 0..15 [out, in] -> GroupQuant.packed [out, in / 32, 16]."""
    blocks = codes.reshape(codes.shape[0], -1, BLOCK)
    return blocks[..., :HALF] | (blocks[..., HALF:] << 4)


def unpack_words(words: torch.Tensor, bits: int = 4, fields: tuple[int, ...] | None = None) -> torch.Tensor:
    """int32 [..., n] -> uint8 [..., n * 32 / bits], field i of each word (`bits` wide, lowest first) at position i,
    or field fields[i] there."""
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    if fields is not None:
        shifts = shifts[list(fields)]
    return ((words.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)).to(torch.uint8).flatten(-2)


def unpack_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int) -> GroupQuant:
    """AutoAWQ's GEMM packing -> GroupQuant."""
    n_in, n_out = qweight.shape[0], qweight.shape[1] * NIBBLES
    _check_shapes("AWQ", {"qweight": (qweight, (n_in, n_out // NIBBLES)),
                          "qzeros": (qzeros, (n_in // group_size, n_out // NIBBLES)),
                          "scales": (scales, (n_in // group_size, n_out))}, n_in, group_size)
    zeros = unpack_words(qzeros, fields=AWQ_NIBBLE_OF_COLUMN).short()
    packed = torch.empty(n_out, n_in // BLOCK, HALF, dtype=torch.uint8)
    # inputs b*32 + h*16 + j. Byte 2a + b of the nibble bytes of parity p holds nibble k = 4a + 2b + p of its word,
    # which is column AWQ_ORDER[k] = 4b + 2p + a of its 8
    by_column = packed.view(n_out // NIBBLES, 2, 2, 2, n_in // BLOCK, HALF)  # [out / 8, b, p, a, blocks, j]
    _fill(qweight.view(-1, 2, HALF, n_out // NIBBLES), lambda parity: by_column[:, :, parity], 3,
          lambda part: part.unflatten(3, (2, 2)).permute(2, 4, 3, 0, 1))  # part: [blocks, j, out / 8, 4 bytes]
    return GroupQuant(packed, scales.t().contiguous(), zeros.t().contiguous(), torch.arange(n_in) // group_size)


def unpack_gptq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor | None,
                group_size: int, zero_offset: int, bits: int = 4) -> GroupQuant:
    """GPTQ's packing -> GroupQuant. `zero_offset`: 1 for the v1 format (stores z - 1), 0 for v2; `bits`: 4 or 8."""
    per_word = 32 // bits
    n_in, n_out = qweight.shape[0] * per_word, qweight.shape[1]
    groups = n_in // group_size
    shapes = {"qweight": (qweight, (n_in // per_word, n_out)), "qzeros": (qzeros, (groups, n_out // per_word)),
              "scales": (scales, (groups, n_out))}
    if g_idx is not None:
        shapes["g_idx"] = (g_idx, (n_in,))
    _check_shapes("GPTQ", shapes, n_in, group_size)
    if bits == 8:  # a word's 4 bytes are 4 consecutive inputs
        packed = qweight.view(torch.uint8).view(n_in // 4, n_out, 4).permute(1, 0, 2).reshape(n_out, n_in)
    else:  # inputs b*32 + h*16 + w*8 + k: word w of each half; nibble k = 2 * (its byte) + parity
        packed = torch.empty(n_out, n_in // BLOCK, HALF, dtype=torch.uint8)
        inputs = packed.view(n_out, n_in // BLOCK, 2, 4, 2)  # [out, blocks, w, byte, parity]
        _fill(qweight.view(-1, 2, 2, n_out), lambda parity: inputs[..., parity], 1,
              lambda part: part.permute(2, 0, 1, 3))  # part: [blocks, w, out, 4 bytes]
    # v1 stores z - 1 (GPTQ's symmetric zero 8 as 7); a stored 15 reads as 16, as GPTQ's own kernels read it
    zeros = (unpack_words(qzeros, bits).short() + zero_offset).t().contiguous()
    g_idx = torch.arange(n_in) // group_size if g_idx is None else g_idx.long()
    if g_idx.min() < 0 or g_idx.max() >= groups:
        raise ProfileError(f"g_idx names groups outside 0..{groups - 1}; the checkpoint is damaged: re-download it")
    return GroupQuant(packed, scales.t().contiguous(), zeros, g_idx, bits)


def _fill(words: torch.Tensor, dest: Callable[[int], torch.Tensor], block_dim: int,
          arrange: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """dest(parity) = arrange(_nibble_bytes(words, parity)), CHUNK_BLOCKS blocks at a time: the int32 temporaries
    stay a few MB whatever the layer's size."""
    for first in range(0, words.shape[0], CHUNK_BLOCKS):
        chunk = words[first:first + CHUNK_BLOCKS]
        for parity in (0, 1):
            dest(parity).narrow(block_dim, first, chunk.shape[0]).copy_(arrange(_nibble_bytes(chunk, parity)))


def _nibble_bytes(words: torch.Tensor, parity: int) -> torch.Tensor:
    """int32 words [blocks, 2 halves, ...] -> uint8 [blocks, ..., 4]: byte i pairs nibble 2i + parity of the first
    half's word (low) with the same nibble of the second half's (high). Two whole-tensor bit operations a parity."""
    low, high = words[:, 0], words[:, 1]
    if parity:
        nibbles = (low >> 4) & LOW_NIBBLES
        nibbles |= high & HIGH_NIBBLES
    else:
        nibbles = low & LOW_NIBBLES
        nibbles |= (high & LOW_NIBBLES) << 4
    return nibbles.contiguous().view(torch.uint8).unflatten(-1, (-1, 4))


def _check_shapes(fmt: str, tensors: dict, n_in: int, group_size: int) -> None:
    if group_size <= 0 or n_in % group_size:
        raise ProfileError(f"{fmt} group_size {group_size} does not divide the layer's {n_in} inputs; the "
                           "checkpoint's quantization_config and its tensors disagree: re-download it")
    for name, (tensor, shape) in tensors.items():
        if tuple(tensor.shape) != shape:
            raise ProfileError(f"{fmt} {name} has shape {tuple(tensor.shape)}, expected {shape} from qweight and "
                               f"group_size {group_size}; the checkpoint is damaged: re-download it")
