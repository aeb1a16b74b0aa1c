"""Weight-only fp16/int8/int4 linears vs float32/bf16 at SmolLM2-135M's shapes, same run.

Peers: torch's float matmuls, fbgemm's fp16 GEMM, torch's int8/int4 weight-only kernels (bf16
activations), and inferplug's own Q8_0/Q4_1 kernels (cpu_kernels; int8 activations, and the head's
Q8_0 kernel on x in two int8 parts), where they build.

One "step" runs every linear of the model once, each with its own weights (30 layers of
qkv 576->960, o 576->576, gate_up 576->3072, down 1536->576, then the 576->49152 lm_head), so the
weights stream from DRAM as in a real decode step instead of sitting hot in cache. Rows = tokens
in the step: 1 (single-stream decode) and 16 (a batch). Peers run interleaved within each repeat
(a shared, noisy machine); medians over --repeats; ratios vs float32 (the F.linear baseline).

    .venv/bin/python bench/quant_linear.py --repeats 20 --json quant-linear.json
    .venv/bin/python bench/quant_linear.py --isa avx2,avx512   # inferplug's kernels on each CPU kernel set
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from inferplug.benchmark.smollm2_shapes import HEAD_SHAPE, LAYER_SHAPES, LAYERS
from inferplug.kernels import cpu as cpu_kernels
from inferplug.quant.block_linear import Q4Linear, Q8HeadLinear, Q8Linear
from inferplug.quant.linear import Fp16Linear, Int4Linear, Int8Linear


def model_weights() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    shapes = LAYER_SHAPES * LAYERS + [HEAD_SHAPE]
    return [torch.randn(shape, generator=generator) * 0.05 for shape in shapes]


def float_step(weights: list[torch.Tensor], dtype: torch.dtype):
    weights = [w.to(dtype) for w in weights]
    return lambda xs: [F.linear(xs[w.shape[1]], w) for w in weights], dtype


def quant_step(weights: list[torch.Tensor], layer_cls):
    layers = [layer_cls.from_float(w) for w in weights]
    return lambda xs: [layer(xs[layer.in_features]) for layer in layers], layer_cls.compute_dtype


def on_isa(isa: str, step, dtype):
    """A kernel peer that runs the `isa` CPU kernel set."""
    def run(xs):
        cpu_kernels.set_isa(isa)
        return step(xs)

    return run, dtype


def time_steps(peers: dict, rows: int, repeats: int) -> dict[str, float]:
    """Median ms per step of each peer, the peers taking turns in every repeat."""
    inputs = {dtype: {k: torch.randn(rows, k, generator=torch.Generator().manual_seed(k)).to(dtype) for k in (576, 1536)}
              for dtype in {dtype for _, dtype in peers.values()}}
    for step, dtype in peers.values():
        step(inputs[dtype])  # warm-up: first-call packing and allocator
    times: dict[str, list[float]] = {name: [] for name in peers}
    for _ in range(repeats):
        for name, (step, dtype) in peers.items():
            start = time.perf_counter()
            step(inputs[dtype])
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--isa", default="", help="CPU kernel sets to run inferplug's kernels on, comma-separated "
                        "(avx2,avx512): a peer each; default: the set INFERPLUG_CPU_ISA or the CPU picks")
    parser.add_argument("--json", default="quant-linear.json")
    args = parser.parse_args()

    weights = model_weights()
    peers = {"float32": float_step(weights, torch.float32), "bf16": float_step(weights, torch.bfloat16),
             "fp16": quant_step(weights, Fp16Linear),
             "int8 torch": quant_step(weights, Int8Linear), "int4 torch": quant_step(weights, Int4Linear)}
    if cpu_kernels.ops() is not None:
        kernel_peers = {"int8 Q8_0": quant_step(weights, Q8Linear), "int4 Q4_1": quant_step(weights, Q4Linear),
                        "Q8_0 head (x in two int8 parts)": quant_step(weights, Q8HeadLinear)}
        isas = args.isa.split(",") if args.isa else [cpu_kernels.chosen_isa()]
        peers |= {f"{name} {isa}" if args.isa else name: on_isa(isa, step, dtype)
                  for name, (step, dtype) in kernel_peers.items() for isa in isas}
    by_rows = {rows: time_steps(peers, rows, args.repeats) for rows in args.rows}
    results = {name: {rows: by_rows[rows][name] for rows in args.rows} for name in peers}

    print(f"torch threads={torch.get_num_threads()}  repeats={args.repeats}  ms per step (all linears once)")
    print(f"{'weights':<20}" + "".join(f"{f'{r} row(s) ms':>14}{'vs fp32':>9}" for r in args.rows))
    for name, by_r in results.items():
        cells = "".join(f"{by_r[r]:>14.2f}{results['float32'][r] / by_r[r]:>8.2f}x" for r in args.rows)
        print(f"{name:<20}{cells}")
    Path(args.json).write_text(json.dumps({"threads": torch.get_num_threads(), "repeats": args.repeats,
                                           "ms_per_step": results}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
