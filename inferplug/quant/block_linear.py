"""int4 / int8 weights in GGUF's Q4_1 / Q8_0 blocks, run by inferplug's own AVX2 kernels
(cpu_kernels/quant_matmul.cpp).

A block covers 32 inputs of one output row: Q4_1 is [fp16 scale, fp16 min, 16 bytes of nibbles]
(w = q * scale + min, q in 0..15), Q8_0 is [fp16 scale, 32 int8] (w = q * scale). The kernels quantize
the activations to int8 per block and multiply-add bytes, as llama.cpp does: at one row a step they
stream 5 or 8.5 bits a weight instead of fbgemm's 16. Re-quantizing a GGUF Q4_1 / Q8_0 model's
dequantized weights gives back its blocks bit for bit, so these layers run the file's own weights.
Past KERNEL_MAX_ROWS rows (prefill) the work is compute-bound: the weight is unpacked for a float matmul.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from inferplug.errors import ProfileError
from inferplug.quant.base import WeightOnlyLinear

BLOCK = 32
KERNEL_MAX_ROWS = 64


class BlockLinear(WeightOnlyLinear):
    """Needs cpu_kernels.ops() loaded (quantize_model picks these classes only then)."""

    compute_dtype = torch.float32
    block_bytes: int
    kind: str  # the kernels' prefix: torch.ops.inferplug.{kind}_matmul / {kind}_dequantize

    def __init__(self, blocks: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.out_features, self.in_features = blocks.shape[0], blocks.shape[1] // self.block_bytes * BLOCK
        self.register_buffer("blocks", blocks)  # uint8 [out, in / 32 * block_bytes]
        self.register_buffer("bias", None if bias is None else bias.float())
        self._kernel = getattr(torch.ops.inferplug, f"{self.kind}_matmul")
        self._dequantize = getattr(torch.ops.inferplug, f"{self.kind}_dequantize")

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> "BlockLinear":
        out_features, in_features = weight.shape
        if in_features % BLOCK:
            raise ProfileError(f"{cls.__name__} needs in_features divisible by 32; this layer has {in_features}.")
        groups = weight.detach().float().reshape(out_features, in_features // BLOCK, BLOCK)
        return cls(cls._pack(groups).reshape(out_features, -1).contiguous(), bias)

    def dequantized(self) -> torch.Tensor:
        """The float weight, unpacked by torch ops (the reference the kernels are tested against)."""
        blocks = self.blocks.view(self.out_features, -1, self.block_bytes)
        return self._unpack(blocks).reshape(self.out_features, self.in_features)

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] <= KERNEL_MAX_ROWS:
            return self._kernel(x.contiguous(), self.blocks)
        return F.linear(x, self._dequantize(self.blocks))

    @staticmethod
    def _pack(groups: torch.Tensor) -> torch.Tensor:  # [out, blocks, 32] float -> [out, blocks, block_bytes] uint8
        raise NotImplementedError

    @staticmethod
    def _unpack(blocks: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


def _halves(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The fp16 field at byte `start` of each block, as float [out, blocks, 1]."""
    return blocks[..., start : start + 2].contiguous().view(torch.float16).float()


class Q4Linear(BlockLinear):
    block_bytes, kind = 20, "q4"

    @staticmethod
    def _pack(groups):
        low = groups.amin(dim=-1, keepdim=True).half()
        scale = ((groups.amax(dim=-1, keepdim=True) - low.float()) / 15).half()
        q = torch.round((groups - low.float()) / scale.float().clamp(min=1e-10)).clamp(0, 15).to(torch.uint8)
        nibbles = q[..., :16] | (q[..., 16:] << 4)  # byte j: input j low, input j + 16 high
        return torch.cat([scale.view(torch.uint8), low.view(torch.uint8), nibbles], dim=-1)

    @staticmethod
    def _unpack(blocks):
        nibbles = blocks[..., 4:]
        return torch.cat([nibbles & 15, nibbles >> 4], dim=-1).float() * _halves(blocks, 0) + _halves(blocks, 2)


class Q8Linear(BlockLinear):
    block_bytes, kind = 34, "q8"

    @staticmethod
    def _pack(groups):
        scale = (groups.abs().amax(dim=-1, keepdim=True) / 127).half()
        q = torch.round(groups / scale.float().clamp(min=1e-10)).clamp(-127, 127).to(torch.int8)
        return torch.cat([scale.view(torch.uint8), q.view(torch.uint8)], dim=-1)

    @staticmethod
    def _unpack(blocks):
        return blocks[..., 2:].view(torch.int8).float() * _halves(blocks, 0)
