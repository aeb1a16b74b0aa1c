"""Where an MoE layer's time goes, and the per-expert loop against the one kernel call (kernels/cpu/moe_experts.cpp),
same run, at a real model's geometry:
- qwen3-30b-a3b: hidden 2048, 128 experts, 8 a row, expert MLP 768, Q4_K_M's random blocks (Q4_K gate/up; down Q4_K,
  or Q6_K where llama.cpp's Q4_K_M rule gives more bits);
- gpt-oss-20b: hidden 2880, 32 experts, 4 a row, expert MLP 2880, MXFP4 blocks (as its files ship), the router's and
  experts' biases and the clamped SwiGLU.
Decode steps of 1, 8 and 32 rows and a 512-row prefill; four layers in turn (1.5-1.8 GB), so a step reads its experts
from DRAM, not from cache. Reported: the router's time, each expert path's, the distinct experts a step reads with
their bytes, and those bytes a second.

    .venv/bin/python bench/moe_layer.py --model qwen3-30b-a3b --repeats 20
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import torch

from inferplug.kernels import cpu as cpu_kernels
from inferplug.models.gguf_layers import gguf_layer
from inferplug.models.gguf_random import q4_k_m_type, random_blocks
from inferplug.models.moe import MoeWeights, gate_up_taker, moe_mlp, router_logits
from inferplug.ops.cpu_ops import CpuKernelOps
from inferplug.ops.torch_ops import TorchOps


@dataclass(frozen=True)
class Geometry:
    hidden: int
    experts: int
    top_k: int
    inter: int
    layers: int
    mxfp4: bool  # MXFP4 experts with biases and swiglu_oai (gpt-oss); else Q4_K_M's types and SiLU


GEOMETRIES = {"qwen3-30b-a3b": Geometry(2048, 128, 8, 768, 48, False), "gpt-oss-20b": Geometry(2880, 32, 4, 2880, 24, True)}
BENCH_LAYERS = (6, 7, 8, 9)  # Qwen3-30B-A3B's layer 8 has Q6_K down experts, the others Q4_K
STEPS = {"decode 1": (1, 1), "decode 8": (8, 8), "decode 32": (32, 32), "prefill 512": (512, 0)}  # rows, decode rows


def make_layer(geo: Geometry, layer: int, gen: torch.Generator) -> MoeWeights:
    def experts(name: str, shape: tuple[int, int]):
        kind = "MXFP4" if geo.mxfp4 else q4_k_m_type(f"blk.{layer}.{name}.weight", layer, geo.layers)
        return [gguf_layer(random_blocks(kind, shape, shape[1] ** -0.5, gen), kind, shape, "gguf")
                for _ in range(geo.experts)]

    weights = {"gate.weight": torch.randn(geo.experts, geo.hidden, generator=gen) * geo.hidden**-0.5}
    for name, proj, shape in (("ffn_gate", "gate", (geo.inter, geo.hidden)), ("ffn_up", "up", (geo.inter, geo.hidden)),
                              ("ffn_down", "down", (geo.hidden, geo.inter))):
        weights |= {f"experts.{e}.{proj}_proj.weight": w for e, w in enumerate(experts(name, shape))}
        if geo.mxfp4:
            weights |= {f"experts.{e}.{proj}_proj.bias": torch.randn(shape[0], generator=gen) * 0.1
                        for e in range(geo.experts)}
    if geo.mxfp4:
        weights["gate.bias"] = torch.randn(geo.experts, generator=gen) * 0.1
    return MoeWeights.take(weights.pop, gate_up_taker(weights.pop, weights.__contains__), "", geo.experts,
                           biased=geo.mxfp4)  # as a GGUF load makes them


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
    parser.add_argument("--model", choices=sorted(GEOMETRIES), default="qwen3-30b-a3b")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    geo = GEOMETRIES[args.model]
    kernel_ops = CpuKernelOps(cpu_kernels.ops(), head_dim=128)
    activation = kernel_ops.swiglu_oai_mul if geo.mxfp4 else kernel_ops.silu_mul
    gen = torch.Generator().manual_seed(0)
    layers = [make_layer(geo, i, gen) for i in BENCH_LAYERS]
    expert_bytes = [[g.blocks.numel() + d.blocks.numel() for g, d in zip(m.gate_up, m.down)] for m in layers]
    print(f"{args.model}: {cpu_kernels.isa()}, {torch.get_num_threads()} threads; {len(layers)} layers of "
          f"{sum(expert_bytes[0]) / 2**20:.0f} MiB of experts each")
    paths = {"per-expert loop": TorchOps(), "one call": kernel_ops}
    for label, (rows, decode) in STEPS.items():
        h = torch.randn(rows, geo.hidden, generator=gen) * 0.5
        chosen = [router_logits(h, m, kernel_ops).topk(geo.top_k, dim=-1).indices.unique() for m in layers]
        read = statistics.mean(sum(expert_bytes[i][e] for e in c.tolist()) for i, c in enumerate(chosen))
        distinct = statistics.mean(len(c) for c in chosen)
        router = timed(lambda: [torch.softmax(router_logits(h, m, kernel_ops), -1).topk(geo.top_k, dim=-1) for m in layers],
                       args.repeats) / len(layers)
        results = {}
        for name, ops in paths.items():
            def step():
                for m in layers:
                    moe_mlp(h, m, geo.top_k, True, activation, decode, ops)
            results[name] = timed(step, args.repeats) / len(layers)
        loop, call = results["per-expert loop"], results["one call"]
        print(f"{label}: {distinct:.0f} distinct experts ({read / 2**20:.1f} MiB) a layer; router {router * 1e3:.2f} ms; "
              f"per-expert loop {loop * 1e3:.2f} ms, one call {call * 1e3:.2f} ms ({loop / call:.2f}x; experts "
              f"{read / (call - router) / 1e9:.1f} GB/s)")


if __name__ == "__main__":
    main()
