"""Weight-only int8/int4 linears vs float32/bf16 at SmolLM2-135M's shapes, same run.

One "step" runs every linear of the model once, each with its own weights (30 layers of
qkv 576->960, o 576->576, gate_up 576->3072, down 1536->576, then the 576->49152 lm_head), so the
weights stream from DRAM as in a real decode step instead of sitting hot in cache. Rows = tokens
in the step: 1 (single-stream decode) and 32 (a batch). Medians over --repeats; ratios vs bf16.

    .venv/bin/python bench/quant_linear.py --repeats 20 --json quant-linear.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from inferplug.quant.linear import Int4Linear, Int8Linear

LAYERS = 30
LAYER_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # (out, in): qkv, o, gate_up, down
HEAD_SHAPE = (49152, 576)


def model_weights() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    shapes = LAYER_SHAPES * LAYERS + [HEAD_SHAPE]
    return [torch.randn(shape, generator=generator) * 0.05 for shape in shapes]


def float_step(weights: list[torch.Tensor], dtype: torch.dtype):
    weights = [w.to(dtype) for w in weights]
    return lambda xs: [F.linear(xs[w.shape[1]], w) for w in weights], dtype


def quant_step(weights: list[torch.Tensor], layer_cls):
    layers = [layer_cls.from_float(w) for w in weights]
    return lambda xs: [layer(xs[layer.in_features]) for layer in layers], torch.bfloat16


def time_step(step, dtype: torch.dtype, rows: int, repeats: int) -> float:
    inputs = {k: torch.randn(rows, k).to(dtype) for k in {576, 1536}}
    step(inputs)  # warm-up: first-call packing and allocator
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step(inputs)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--json", default="quant-linear.json")
    args = parser.parse_args()

    weights = model_weights()
    peers = {
        "float32": lambda: float_step(weights, torch.float32),
        "bf16": lambda: float_step(weights, torch.bfloat16),
        "int8": lambda: quant_step(weights, Int8Linear),
        "int4": lambda: quant_step(weights, Int4Linear),
    }
    results = {}
    for name, build in peers.items():
        step, dtype = build()
        results[name] = {rows: time_step(step, dtype, rows, args.repeats) for rows in args.rows}
        del step

    print(f"torch threads={torch.get_num_threads()}  repeats={args.repeats}  ms per step (all linears once)")
    print(f"{'weights':<10}" + "".join(f"{f'{r} row(s) ms':>14}{'vs bf16':>9}" for r in args.rows))
    for name, by_rows in results.items():
        cells = "".join(f"{by_rows[r]:>14.2f}{results['bf16'][r] / by_rows[r]:>8.2f}x" for r in args.rows)
        print(f"{name:<10}{cells}")
    Path(args.json).write_text(json.dumps({"threads": torch.get_num_threads(), "repeats": args.repeats,
                                           "ms_per_step": results}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
