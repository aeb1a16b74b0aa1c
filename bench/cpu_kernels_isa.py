"""inferplug's CPU kernels per instruction set (AVX2 vs AVX-512 + VNNI), same process, same inputs.

Per kernel and row count, the sets take turns in every repeat (a shared, noisy machine) and the table
gives medians and the AVX-512 / AVX2 speed ratio. The matmuls run SmolLM2-135M's linears as one step
(30 layers of Q4_1 or Q8_0 qkv, o, gate_up, down, each with its own weights, so they stream from DRAM as
in decode), the head its 576 -> 49152 Q8_0 matmul on x in two int8 parts; paged decode one layer's attention over
rows sequences of --context tokens (9 heads on 3 kv heads of 64).

    .venv/bin/python bench/cpu_kernels_isa.py --threads 2 --repeats 15 --json cpu-kernels-isa.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from inferplug.benchmark.smollm2_shapes import HEAD_SHAPE, LAYER_SHAPES, LAYERS
from inferplug.kernels import cpu as cpu_kernels
from inferplug.quant.block_linear import Q4Linear, Q8HeadLinear, Q8Linear
from inferplug.kernels.paged_attention_ref import random_pool


def matmul_step(layer_cls, shapes):
    generator = torch.Generator().manual_seed(0)
    layers = [layer_cls.from_float(torch.randn(shape, generator=generator) * 0.05) for shape in shapes]
    return lambda xs: [layer._kernel(xs[layer.in_features], layer.blocks) for layer in layers]


def attention_step(rows: int, context: int):
    q, k_cache, v_cache, tables, lens = random_pool(batch=rows, heads=9, kv_heads=3, head_dim=64, block_size=16,
                                                    seq_lens=[context] * rows)
    ops, tables, lens = cpu_kernels.ops(), tables.long(), lens.long()
    return lambda xs: ops.paged_decode(q, k_cache, v_cache, tables, lens, 0.125)


def time_isas(step, rows: int, isas: list[str], repeats: int) -> dict[str, float]:
    """Median ms of one step per kernel set, the sets taking turns in every repeat."""
    xs = {k: torch.randn(rows, k, generator=torch.Generator().manual_seed(k)) for k in (576, 1536)}
    times: dict[str, list[float]] = {isa: [] for isa in isas}
    for i in range(repeats + 1):
        for isa in isas:
            cpu_kernels.set_isa(isa)
            start = time.perf_counter()
            step(xs)
            if i:  # the first round warms caches and allocator
                times[isa].append(time.perf_counter() - start)
    return {isa: statistics.median(t) * 1e3 for isa, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--context", type=int, default=256, help="tokens each paged-decode sequence attends to")
    parser.add_argument("--json", default="cpu-kernels-isa.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if cpu_kernels.ops() is None:
        raise SystemExit(f"the CPU kernels cannot run here: {cpu_kernels.unavailable_reason()}")
    isas = cpu_kernels.supported_isas()
    steps = {"q4_matmul (30 layers)": lambda rows: matmul_step(Q4Linear, LAYER_SHAPES * LAYERS),
             "q8_matmul (30 layers)": lambda rows: matmul_step(Q8Linear, LAYER_SHAPES * LAYERS),
             "q8_head_matmul (head)": lambda rows: matmul_step(Q8HeadLinear, [HEAD_SHAPE]),
             "paged_decode (1 layer)": lambda rows: attention_step(rows, args.context)}
    results = {}
    for name, make in steps.items():
        built = {}  # the matmuls' weights do not depend on the rows: build them once
        for rows in args.rows:
            step = built.setdefault("step", make(rows)) if "matmul" in name else make(rows)
            results.setdefault(name, {})[rows] = time_isas(step, rows, isas, args.repeats)
    print(f"threads={args.threads}  repeats={args.repeats}  median ms per step; ratio: {isas[0]} time / {isas[-1]} time")
    print(f"{'kernel':<26}{'rows':>5}" + "".join(f"{isa:>10}" for isa in isas) + f"{'ratio':>8}")
    for name, by_rows in results.items():
        for rows, ms in by_rows.items():
            print(f"{name:<26}{rows:>5}" + "".join(f"{ms[isa]:>10.3f}" for isa in isas) + f"{ms[isas[0]] / ms[isas[-1]]:>7.2f}x")
    Path(args.json).write_text(json.dumps({"threads": args.threads, "repeats": args.repeats, "context": args.context,
                                           "ms_per_step": results}, indent=2))


if __name__ == "__main__":
    main()
