"""Prefill's quantized matmul (quant/block_linear.py's prefill rows) in GFLOP/s, per path and shape, same run.

Paths, each over the same Q4_1 (or Q8_0) weights and M prompt rows:
  unpack+fp32  the path before [native] prefill_gemm: the whole weight dequantized to float32, one F.linear
  float32      inferplug's tiled kernel (kernels/cpu/prefill_gemm.h): a panel dequantized at a time, fp32 FMAs
  bfloat16     the same tiles in bf16 (vdpbf16ps where the CPU has AVX512_BF16), float32 sums
  bfloat16-onednn  torch's bf16 matmul (oneDNN) over panels dequantized to bf16, in fixed 128-row calls
  int8         the decode kernel (q4_matmul / q8_matmul): x rounded to int8 per block, VNNI / AVX2 dot products
  torch-bf16   a peer, not a path: F.linear over bf16 weights already unpacked (oneDNN), the ceiling torch offers
Shapes: Llama-7B's qkv, o, gate_up and down, and SmolLM2-135M's. Paths run interleaved within each repeat (a
shared, noisy machine); the table gives medians over --repeats.

    .venv/bin/python bench/prefill_gemm.py --rows 512 --repeats 5 --json prefill-gemm.json
    .venv/bin/python bench/prefill_gemm.py --isa avx2,avx512 --format q8
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from inferplug.kernels import cpu as cpu_kernels
from inferplug.quant.block_linear import Q4Linear, Q8Linear

SHAPES = {  # (out, in)
    "7b qkv": (6144, 4096), "7b o": (4096, 4096), "7b gate_up": (28672, 4096), "7b down": (4096, 14336),
    "smollm2 qkv": (960, 576), "smollm2 o": (576, 576), "smollm2 gate_up": (3072, 576), "smollm2 down": (576, 1536),
}
PATHS = ("unpack+fp32", "float32", "bfloat16", "bfloat16-onednn", "int8", "torch-bf16")


def path_fns(layer, weight_bf16: torch.Tensor, x: torch.Tensor) -> dict:
    ops = cpu_kernels.ops()
    prefill = getattr(ops, layer.kernel.replace("matmul", "prefill_matmul"))
    x_bf16 = x.bfloat16()

    def onednn():
        layer.prefill_gemm = "bfloat16-onednn"
        return layer(x, decode_rows=0)
    return {"unpack+fp32": lambda: F.linear(x, getattr(ops, layer.unpack)(layer.blocks)),
            "float32": lambda: prefill(x, layer.blocks, "float32"),
            "bfloat16": lambda: prefill(x, layer.blocks, "bfloat16"),
            "bfloat16-onednn": onednn,
            "int8": lambda: getattr(ops, layer.kernel)(x, layer.blocks),
            "torch-bf16": lambda: F.linear(x_bf16, weight_bf16)}


def measure(shape: tuple[int, int], rows: int, layer_cls, repeats: int) -> dict[str, float]:
    out_features, in_features = shape
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(shape, generator=generator) * 0.02
    layer = layer_cls.from_float(weight)
    fns = path_fns(layer, layer.dequantized().bfloat16(), torch.randn(rows, in_features, generator=generator))
    del weight
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()  # warm-up
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    flops = 2 * rows * out_features * in_features
    return {name: flops / statistics.median(ts) / 1e9 for name, ts in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--format", choices=("q4", "q8"), default="q4")
    parser.add_argument("--isa", default=None, help="comma-separated CPU kernel sets (default: the best here)")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated names from: " + ", ".join(SHAPES))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if cpu_kernels.ops() is None:
        raise SystemExit(f"inferplug's CPU kernels cannot run here: {cpu_kernels.unavailable_reason()}")
    layer_cls = Q4Linear if args.format == "q4" else Q8Linear
    results = []
    print(f"{args.format} weights, M = {args.rows} rows, {torch.get_num_threads()} threads, "
          f"bf16 by {cpu_kernels.ops().bfloat16_dot()}; GFLOP/s, median of {args.repeats}")
    print(f"{'isa':12} {'shape':16} " + " ".join(f"{p:>11}" for p in PATHS))
    for isa in (args.isa.split(",") if args.isa else [cpu_kernels.chosen_isa()]):
        cpu_kernels.set_isa(isa)
        for name in args.shapes.split(","):
            rates = measure(SHAPES[name], args.rows, layer_cls, args.repeats)
            results.append({"isa": isa, "shape": name, "out_in": SHAPES[name], "rows": args.rows,
                            "format": args.format, "gflops": rates})
            print(f"{isa:12} {name:16} " + " ".join(f"{rates[p]:11.1f}" for p in PATHS), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"threads": torch.get_num_threads(), "results": results}, indent=2))


if __name__ == "__main__":
    main()
