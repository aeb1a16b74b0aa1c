"""int4 / int8 weights in GGUF's Q4_1 / Q8_0 blocks, run by inferplug's own CPU kernels
(kernels/cpu/quant_matmul.cpp; AVX2, or AVX-512 + VNNI).

A block covers 32 inputs of one output row: Q4_1 is [fp16 scale, fp16 min, 16 bytes of nibbles]
(w = q * scale + min, q in 0..15), Q8_0 is [fp16 scale, 32 int8] (w = q * scale). A row stores its
blocks field by field (all scales, all mins, all quants), so the kernels convert 8 scales at once, and
the layers' quants by runs of 16 blocks with their 4-byte words interleaved (word 0 of each block, then
word 1, ...), so each block's integer dot product lands in its own vector lane (kernels/cpu/kernels.h).
The layers' kernels quantize the activations to int8 per block and multiply-add bytes, as llama.cpp
does (the head's keeps them float): at one row a step they stream 5 or 8.5 bits a weight instead of
fbgemm's 16. Re-quantizing a GGUF Q4_1 / Q8_0 model's dequantized weights gives back its blocks bit
for bit, so these layers run the file's own weights.
Prefill rows take `prefill_gemm`, fixed per model (the profile's [native] prefill_gemm; set_prefill_gemm):
"float32" (the default: int8 activations over a whole prompt turned SmolLM2's "The capital of France is Paris."
into "L'Étoile, ..."), "bfloat16", "bfloat16-onednn" or "int8" (the decode kernel). The float paths dequantize a
panel of weight rows at a time and pass every prompt row over it (kernels/cpu/prefill_gemm.h): no float copy of the
weight. "bfloat16-onednn" does the same with torch's bf16 matmul (oneDNN, which runs AMX tiles where the host has
them) over panels dequantized to bf16. The engine says which rows decode (`decode_rows`), so a row takes the same
path whatever shares its step, and every path sums each output in one order whatever the row count (batch
invariance). Which path runs is timed on the user's host (host_timings.py), not read off its ISA flags.
"""

from __future__ import annotations

from typing import Callable

import torch

from inferplug.errors import ProfileError
from inferplug.quant.base import WeightOnlyLinear

BLOCK = 32
KERNEL_MAX_ROWS = 64  # the longest step decode_layers fuses (models/decoder.py)
PREFILL_GEMMS = ("float32", "bfloat16", "bfloat16-onednn", "int8")  # how prefill rows multiply: x and weights so
# bfloat16-onednn: every oneDNN call is [ONEDNN_ROWS, K] x [K, a panel] (the last rows padded), one GEMM shape whatever
# the step holds, so a row's sums do not depend on its neighbours; a panel of ONEDNN_PANEL weight rows is
# dequantized at a time (4 MiB of bf16 at K = 4096: no whole copy of the weight). 128 x 512: the best of 64-256 rows
# and 256-1024 columns on Zen 5, ~700 GFLOP/s on 2 threads at 512 rows (bench/prefill_gemm.py times the path).
ONEDNN_ROWS, ONEDNN_PANEL = 128, 512
ROW_RUN_WEIGHTS = 1 << 22  # weights a layer is packed from at once: 16 MB of fp32, and its temporaries
RUN, WORD = 16, 4  # the quants' interleaving: runs of 16 blocks, 4-byte words
# E2M1's values doubled (ggml's kvalues_mxfp4): an MXFP4 code's value is this times 2^(e - 128), e its block's E8M0 byte
MXFP4_VALUES = torch.tensor([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=torch.int8)


class BlockLinear(WeightOnlyLinear):
    """Needs cpu_kernels.ops() loaded (quantize_model picks these classes only then)."""

    compute_dtype = torch.float32
    fields: tuple[int, ...]  # a block's fields' bytes, in the order a row stores them
    spans: tuple[int, ...] = ()  # blocks one entry of each field covers (Q4_K's d and dmin: 8 each); () for 1 each
    kernel: str  # torch.ops.inferplug.<kernel>(x, blocks): the matmul of decode rows
    prefill: str  # torch.ops.inferplug.<prefill>(x, blocks, precision): float32 / bfloat16 prefill rows
    unpack: str  # torch.ops.inferplug.<unpack>(blocks): the float rows of these blocks (embedding lookups, repacks)
    prefill_gemm = "float32"  # one of PREFILL_GEMMS, set for the whole model by set_prefill_gemm

    def __init__(self, blocks: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.out_features, self.in_features = blocks.shape[0], self.blocks_in(blocks.shape[1]) * BLOCK
        self.register_buffer("blocks", blocks)  # uint8 [out, in / 32 * block bytes]
        self.register_buffer("bias", None if bias is None else bias.float())
        # The ops' overloads, not their packets: a decode step calls the kernel ~120 times, ~0.5 us saved each.
        self._kernel = getattr(torch.ops.inferplug, self.kernel).default
        self._prefill = getattr(torch.ops.inferplug, self.prefill).default
        self._dequantize = getattr(torch.ops.inferplug, self.unpack).default  # rows(), requantized(): a few rows each

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> "BlockLinear":
        """Packed a few rows at a time (packed_in_row_runs; each row's blocks are its own): a whole fp32 copy of a
        152k-row head, and its packing's temporaries, would be several GB at load."""
        out_features, in_features = weight.shape
        if in_features % BLOCK:
            raise ProfileError(f"{cls.__name__} needs in_features divisible by 32; this layer has {in_features}.")
        cls.field_bytes(in_features // BLOCK)  # whole super-blocks, where the format has them

        def pack(start: int, end: int) -> torch.Tensor:
            groups = weight[start:end].detach().float().reshape(-1, in_features // BLOCK, BLOCK)
            return cls.pack_fields(*cls._pack(groups))

        return cls(packed_in_row_runs(out_features, in_features, pack), bias)

    @classmethod
    def from_fields(cls, *fields: torch.Tensor, bias: torch.Tensor | None = None) -> "BlockLinear":
        """The layer from its blocks' fields (pack_fields' rows)."""
        return cls(cls.pack_fields(*fields), bias)

    @classmethod
    def pack_fields(cls, *fields: torch.Tensor) -> torch.Tensor:
        """The rows (uint8 [out, row bytes]) of blocks' fields, each uint8 [out, blocks, bytes] in `fields` order,
        quants last (as _pack gives them; quant/checkpoint_layers.py packs AWQ / GPTQ groups so). Each field is copied
        once, straight into its place in the rows: a 7B checkpoint's load holds no second copy of a layer."""
        out_features, blocks = fields[-1].shape[:2]
        sizes = cls.field_bytes(blocks)
        rows = torch.empty(out_features, sum(sizes), dtype=torch.uint8)
        start = 0
        for index, (field, size, nbytes) in enumerate(zip(fields, cls.fields, sizes)):
            dest = rows[:, start:start + nbytes]
            field = field.reshape(out_features, nbytes // size, size)
            if index == len(fields) - 1:
                _interleave_into(dest, field)
            else:
                dest.view(out_features, nbytes // size, size).copy_(field)
            start += nbytes
        return rows

    @classmethod
    def field_bytes(cls, blocks: int) -> list[int]:
        """Each field's bytes in a row of `blocks` blocks."""
        spans = cls.spans or (1,) * len(cls.fields)
        if any(blocks % span for span in spans):
            raise ProfileError(f"{cls.__name__} needs whole groups of {max(spans)} blocks ({max(spans) * BLOCK} inputs); "
                               f"this row has {blocks * BLOCK}.")
        return [blocks // span * size for size, span in zip(cls.fields, spans)]

    @classmethod
    def blocks_in(cls, row_bytes: int) -> int:
        """The blocks a row of `row_bytes` holds."""
        largest = max(cls.spans or (1,))  # the smallest whole row
        blocks = row_bytes // sum(cls.field_bytes(largest)) * largest
        if sum(cls.field_bytes(blocks)) != row_bytes:
            raise ProfileError(f"{row_bytes} bytes are not a whole row of {cls.__name__} blocks.")
        return blocks

    @classmethod
    def requantized(cls, layer: "BlockLinear", rows_at_once: int = 256) -> "BlockLinear":
        """`layer`'s weight in this class's blocks, a few rows at a time (no whole float copy): Q4_1 as Q8_0 is at
        most half a Q8_0 step (max |w| / 254 per 32 weights) off."""
        blocks = [cls.from_float(layer._dequantize(layer.blocks[start:start + rows_at_once])).blocks
                  for start in range(0, layer.out_features, rows_at_once)]
        return cls(torch.cat(blocks), layer.bias)

    def dequantized(self) -> torch.Tensor:
        """The float weight, unpacked by torch ops (the reference the kernels are tested against)."""
        fields = self.blocks.split(self.field_bytes(self.in_features // BLOCK), dim=1)
        *fields, quants = (f.reshape(self.out_features, f.shape[1] // size, size) for f, size in zip(fields, self.fields))
        weight = self._unpack(*fields, _deinterleave(quants))
        return weight.reshape(self.out_features, self.in_features)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The float weight's rows `ids`: an embedding lookup in the table's own blocks."""
        return self._dequantize(self.blocks.index_select(0, ids))

    def forward(self, x: torch.Tensor, decode_rows: int | None = None) -> torch.Tensor:
        if self.blocks.device.type != "cpu":  # no kernel of ours there (gpt-oss's MXFP4 experts on CUDA outside the
            # grouped GEMM): the weight unpacked by torch ops
            out = x @ self.dequantized().to(x.dtype).T
            return out if self.bias is None else out + self.bias.to(out.dtype)
        if decode_rows is None or decode_rows >= x.shape[0] or self.prefill_gemm == "int8":
            return super().forward(x)  # the head's kernel takes any rows as they are
        prompt = x[decode_rows:]
        out = self._onednn_prefill(prompt) if self.prefill_gemm == "bfloat16-onednn" else \
            self._prefill(prompt.contiguous(), self.blocks, self.prefill_gemm)
        out = out if self.bias is None else out + self.bias
        return out if decode_rows == 0 else torch.cat([super().forward(x[:decode_rows]), out])

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        return self._kernel(x.contiguous(), self.blocks)

    def _onednn_prefill(self, x: torch.Tensor) -> torch.Tensor:
        """Prompt rows x [M, K] by torch's bf16 matmul over the weight dequantized to bf16 a panel at a time; the
        sums are float32 and the result bf16, widened to float32."""
        rows = x.shape[0]
        padded = torch.zeros(-(-rows // ONEDNN_ROWS) * ONEDNN_ROWS, self.in_features, dtype=torch.bfloat16)
        padded[:rows] = x
        out = torch.empty(padded.shape[0], self.out_features)
        for first in range(0, self.out_features, ONEDNN_PANEL):
            panel = self._dequantize(self.blocks[first:first + ONEDNN_PANEL], True).t()  # bf16, in one pass
            for row in range(0, padded.shape[0], ONEDNN_ROWS):
                out[row:row + ONEDNN_ROWS, first:first + panel.shape[1]] = torch.mm(padded[row:row + ONEDNN_ROWS], panel)
        return out[:rows]

    @staticmethod
    def _pack(groups: torch.Tensor) -> tuple[torch.Tensor, ...]:  # [out, blocks, 32] float -> per field uint8 [out, blocks, bytes]
        raise NotImplementedError

    @staticmethod
    def _unpack(*fields: torch.Tensor) -> torch.Tensor:  # the inverse: [out, blocks, 32] float
        raise NotImplementedError


def packed_in_row_runs(out_features: int, in_features: int, pack: Callable[[int, int], torch.Tensor]) -> torch.Tensor:
    """A layer's rows (uint8 [out_features, row bytes]) made by pack(start, end) a run of rows at a time, each run
    about ROW_RUN_WEIGHTS weights: a whole matrix's float copy and its packing's temporaries are never made."""
    step = max(1, ROW_RUN_WEIGHTS // in_features)
    rows = None
    for start in range(0, out_features, step):
        part = pack(start, start + step)
        if rows is None:
            rows = torch.empty(out_features, part.shape[1], dtype=torch.uint8)
        rows[start:start + step] = part
    return rows


def set_prefill_gemm(model, path: str) -> None:
    """Every block layer of `model` (inferplug's DecoderModel, or any nn.Module) multiplies its prefill rows by `path`
    (one of PREFILL_GEMMS), from now on: once per model, never per step, so a prompt's K/V do not depend on when
    it ran."""
    if path not in PREFILL_GEMMS:
        raise ProfileError(f"prefill_gemm = {path!r} is not a prefill path: use one of {', '.join(PREFILL_GEMMS)} (or auto).")
    modules = [model] if isinstance(model, torch.nn.Module) else \
        [value for layer in model.layers for value in layer.linears() if isinstance(value, torch.nn.Module)]
    for module in (m for top in modules for m in top.modules()):  # an AWQ / GPTQ layer's inner block layer too
        if isinstance(module, BlockLinear):
            module.prefill_gemm = path


def _interleave_into(dest: torch.Tensor, quants: torch.Tensor) -> None:
    """dest [out, blocks * bytes] (a view into the rows) = quants [out, blocks, bytes] with each run of 16 blocks
    (fewer in the last) as its blocks' word 0, word 1, ..."""
    out, blocks, size = quants.shape
    full = blocks - blocks % RUN
    for first, last, run in ((0, full, RUN), (full, blocks, blocks - full)):  # the whole runs, then a short one
        if last > first:
            runs = (last - first) // run
            source = quants[:, first:last].reshape(out, runs, run, size // WORD, WORD).transpose(2, 3)
            dest[:, first * size:last * size].view(out, runs, size // WORD, run, WORD).copy_(source)


def _deinterleave(quants: torch.Tensor) -> torch.Tensor:
    """The inverse of _interleave_into: [out, blocks, bytes] from the rows' quants, viewed so."""
    runs = quants.split(RUN, dim=1)
    return torch.cat([r.reshape(r.shape[0], -1, r.shape[1], WORD).transpose(1, 2).reshape(r.shape) for r in runs], dim=1)


def fp16_floats(halves: torch.Tensor) -> torch.Tensor:
    """An fp16 field's bytes [out, blocks, 2] as float [out, blocks, 1]."""
    return halves.contiguous().view(torch.float16).float()


class Q4Linear(BlockLinear):
    fields, kernel, prefill, unpack = (2, 2, 16), "q4_matmul", "q4_prefill_matmul", "q4_dequantize"  # scale, min, nibbles

    @staticmethod
    def _pack(groups):
        low = groups.amin(dim=-1, keepdim=True).half()
        scale = ((groups.amax(dim=-1, keepdim=True) - low.float()) / 15).half()
        q = torch.round((groups - low.float()) / scale.float().clamp(min=1e-10)).clamp(0, 15).to(torch.uint8)
        nibbles = q[..., :16] | (q[..., 16:] << 4)  # byte j: input j low, input j + 16 high
        return scale.view(torch.uint8), low.view(torch.uint8), nibbles

    @staticmethod
    def _unpack(scale, low, nibbles):
        return torch.cat([nibbles & 15, nibbles >> 4], dim=-1).float() * fp16_floats(scale) + fp16_floats(low)


class Q4G128Linear(Q4Linear):
    """Q4Linear's blocks for weights quantized in groups of 128 inputs (AWQ's and GPTQ's default): the 4 blocks of a
    group share its fp16 scale and min, stored once. The same values as Q4_1, in 4.25 bits a weight instead of 5."""

    spans = (4, 4, 1)  # scale, min, nibbles
    kernel, prefill, unpack = "q4_g128_matmul", "q4_g128_prefill_matmul", "q4_g128_dequantize"

    @staticmethod
    def _pack(groups):
        out, blocks = groups.shape[:2]
        groups = groups.reshape(out, blocks // 4, 4 * BLOCK)
        low = groups.amin(dim=-1, keepdim=True).half()
        scale = ((groups.amax(dim=-1, keepdim=True) - low.float()) / 15).half()
        q = torch.round((groups - low.float()) / scale.float().clamp(min=1e-10)).clamp(0, 15).to(torch.uint8)
        q = q.reshape(out, blocks, BLOCK)
        return scale.view(torch.uint8), low.view(torch.uint8), q[..., :16] | (q[..., 16:] << 4)

    @staticmethod
    def _unpack(scale, low, nibbles):
        return Q4Linear._unpack(*(half.repeat_interleave(4, dim=1) for half in (scale, low)), nibbles)


class Q8Linear(BlockLinear):
    fields, kernel, prefill, unpack = (2, 32), "q8_matmul", "q8_prefill_matmul", "q8_dequantize"  # scale, int8 quants

    @staticmethod
    def _pack(groups):
        scale = (groups.abs().amax(dim=-1, keepdim=True) / 127).half()
        q = torch.round(groups / scale.float().clamp(min=1e-10)).clamp(-127, 127).to(torch.int8)
        return scale.view(torch.uint8), q.view(torch.uint8)

    @staticmethod
    def _unpack(scale, q):
        return q.view(torch.int8).float() * fp16_floats(scale)


class MXFP4Linear(BlockLinear):
    """gpt-oss's MXFP4 experts as the file holds them: per 32 inputs a scale 2^(e - 128) (the E8M0 byte, as an exact
    fp16) and 16 bytes of 4-bit codes, each indexing E2M1's values doubled (0, ±1, ±2, ±3, ±4, ±6, ±8, ±12). The
    kernels look the codes up as int8 weights (kernels/cpu/block_formats.h). A GGUF's load as they are
    (models/gguf_layers.py); from_float quantizes as llama.cpp's quantize_row_mxfp4_ref does."""

    fields, kernel, prefill, unpack = (2, 16), "mxfp4_matmul", "mxfp4_prefill_matmul", "mxfp4_dequantize"

    @staticmethod
    def _pack(groups):
        # llama.cpp's scale: e = floor(log2(amax)) - 2 + 127, so 2^(e - 128) = 2^floor(log2 amax) / 8 (its largest
        # value 12 times that: 1.5 * 2^floor(log2 amax)); each weight the nearest value, the first on a tie
        amax = groups.abs().amax(dim=-1, keepdim=True)
        scale = torch.exp2(torch.floor(torch.log2(amax.clamp(min=2.0**-126))) - 3).half()
        values = MXFP4_VALUES.float() * scale.float()[..., None]  # [out, blocks, 1, 16]
        q = (values - groups[..., None]).abs().argmin(dim=-1).to(torch.uint8)
        return scale.view(torch.uint8), q[..., :16] | (q[..., 16:] << 4)

    @staticmethod
    def _unpack(scale, nibbles):
        codes = torch.cat([nibbles & 15, nibbles >> 4], dim=-1).long()
        return MXFP4_VALUES.to(codes.device)[codes].float() * fp16_floats(scale)


class Q8HeadLinear(Q8Linear):
    """Q8_0 blocks for the lm_head, whose logits pick every token: x goes in as two int8 parts, its rounding and
    its remainder's (about 15 bits of x; kernels/cpu/matmul_input.h quantize_in_two_parts), not one rounding. Half
    fp16's bytes, and exact for a GGUF's Q8_0 embedding."""

    kernel = "q8_head_matmul"
