"""Where an MoE layer's time goes, and the per-expert loop against the one kernel call (kernels/cpu/moe_experts.cpp),
same run, at Qwen3-30B-A3B's geometry: hidden 2048, 128 experts, 8 a row, expert MLP 768, Q4_K_M's random blocks
(Q4_K gate/up; down Q4_K, or Q6_K where llama.cpp's Q4_K_M rule gives more bits). Decode steps of 1, 8 and 32 rows
and a 512-row prefill; four layers in turn (1.5 GB), so a step reads its experts from DRAM, not from cache. Reported:
the router's time, each expert path's, the distinct experts a step reads with their bytes, and those bytes a second.

    .venv/bin/python bench/moe_layer.py --repeats 20
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from inferplug.kernels import cpu as cpu_kernels
from inferplug.models.gguf_layers import gguf_layer
from inferplug.models.gguf_random import q4_k_m_type, random_blocks
from inferplug.models.moe import MoeWeights, moe_mlp, router_logits
from inferplug.ops.cpu_ops import CpuKernelOps
from inferplug.ops.torch_ops import TorchOps

HIDDEN, EXPERTS, TOP_K, INTER, LAYERS = 2048, 128, 8, 768, 48
BENCH_LAYERS = (6, 7, 8, 9)  # layer 8 has Q6_K down experts, the others Q4_K
STEPS = {"decode 1": (1, 1), "decode 8": (8, 8), "decode 32": (32, 32), "prefill 512": (512, 0)}  # rows, decode rows


def make_layer(layer: int, gen: torch.Generator) -> MoeWeights:
    def experts(name: str, shape: tuple[int, int]):
        kind = q4_k_m_type(f"blk.{layer}.{name}.weight", layer, LAYERS)
        return [gguf_layer(random_blocks(kind, shape, shape[1] ** -0.5, gen), kind, shape, "gguf") for _ in range(EXPERTS)]

    weights = {"gate.weight": torch.randn(EXPERTS, HIDDEN, generator=gen) * HIDDEN**-0.5}
    for name, proj, shape in (("ffn_gate", "gate", (INTER, HIDDEN)), ("ffn_up", "up", (INTER, HIDDEN)),
                              ("ffn_down", "down", (HIDDEN, INTER))):
        weights |= {f"experts.{e}.{proj}_proj.weight": w for e, w in enumerate(experts(name, shape))}
    return MoeWeights.take(weights.pop, "", EXPERTS)  # as a GGUF load makes them


def timed(fn, repeats: int) -> float:
    times = []
    for repeat in range(repeats + 1):  # the first a warm-up
        start = time.perf_counter()
        fn()
        if repeat:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    kernel_ops = CpuKernelOps(cpu_kernels.ops(), head_dim=128)
    gen = torch.Generator().manual_seed(0)
    layers = [make_layer(i, gen) for i in BENCH_LAYERS]
    expert_bytes = [[g.blocks.numel() + d.blocks.numel() for g, d in zip(m.gate_up, m.down)] for m in layers]
    print(f"{cpu_kernels.isa()}, {torch.get_num_threads()} threads; {len(layers)} layers of "
          f"{sum(expert_bytes[0]) / 2**20:.0f} MiB of experts each")
    paths = {"per-expert loop": TorchOps(), "one call": kernel_ops}
    for label, (rows, decode) in STEPS.items():
        h = torch.randn(rows, HIDDEN, generator=gen) * 0.5
        chosen = [router_logits(h, m.router).topk(TOP_K, dim=-1).indices.unique() for m in layers]
        read = statistics.mean(sum(expert_bytes[i][e] for e in c.tolist()) for i, c in enumerate(chosen))
        distinct = statistics.mean(len(c) for c in chosen)
        router = timed(lambda: [torch.softmax(router_logits(h, m.router), -1).topk(TOP_K, dim=-1) for m in layers],
                       args.repeats) / len(layers)
        results = {}
        for name, ops in paths.items():
            def step():
                for m in layers:
                    moe_mlp(h, m, TOP_K, True, kernel_ops.silu_mul, decode, ops)
            results[name] = timed(step, args.repeats) / len(layers)
        loop, call = results["per-expert loop"], results["one call"]
        print(f"{label}: {distinct:.0f} distinct experts ({read / 2**20:.1f} MiB) a layer; router {router * 1e3:.2f} ms; "
              f"per-expert loop {loop * 1e3:.2f} ms, one call {call * 1e3:.2f} ms ({loop / call:.2f}x; experts "
              f"{read / (call - router) / 1e9:.1f} GB/s)")


if __name__ == "__main__":
    main()
