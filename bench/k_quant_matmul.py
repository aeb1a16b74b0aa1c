"""The K-quant decode matmuls at Llama/Mistral-7B MLP shapes (gate_up 28672x4096, down 4096x14336), same run:
q4_k / q5_k / q6_k_matmul, and Q5_K as the Q8_0 blocks it ran as before it had its own, at 1 and 8 rows on each
CPU kernel set. Weights are random file blocks (models/gguf_random.py) converted as a GGUF load converts them; peers
take turns in every repeat; medians. The bytes are exact, the times as noisy as the host.

    .venv/bin/python bench/k_quant_matmul.py --repeats 15
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from inferplug.kernels import cpu as cpu_kernels
from inferplug.models.gguf_layers import gguf_layer
from inferplug.models.gguf_random import random_blocks

SHAPES = {"gate_up": (28672, 4096), "down": (4096, 14336)}
PEERS = {"Q4_K": ("Q4_K", "gguf"), "Q5_K": ("Q5_K", "gguf"), "Q6_K": ("Q6_K", "gguf"), "Q5_K as Q8_0": ("Q5_K", "int8")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    cpu_kernels.ops()
    gen = torch.Generator().manual_seed(0)
    layers = {peer: [gguf_layer(random_blocks(t, s, s[1] ** -0.5, gen), t, s, target) for s in SHAPES.values()]
              for peer, (t, target) in PEERS.items()}
    weight_bytes = {peer: sum(layer.blocks.numel() for layer in ls) for peer, ls in layers.items()}
    print("MLP bytes a step:", ", ".join(f"{peer} {b / 2**20:.1f} MiB" for peer, b in weight_bytes.items()))
    for isa in cpu_kernels.supported_isas():
        cpu_kernels.set_isa(isa)
        for rows in (1, 8):
            xs = {k: torch.randn(rows, k, generator=gen) for k in (4096, 14336)}
            times: dict[str, list[float]] = {peer: [] for peer in layers}
            for repeat in range(args.repeats + 1):  # the first a warm-up
                for peer, ls in layers.items():
                    start = time.perf_counter()
                    for layer in ls:
                        layer(xs[layer.in_features])
                    if repeat:
                        times[peer].append(time.perf_counter() - start)
            ops = 2 * rows * sum(n * k for n, k in SHAPES.values())
            med = {peer: statistics.median(t) for peer, t in times.items()}
            print(f"{isa}, {rows} rows: " + ", ".join(f"{peer} {med[peer] * 1e3:.1f} ms ({ops / med[peer] / 1e9:.0f} GOP/s, "
                                                      f"{weight_bytes[peer] / med[peer] / 1e9:.1f} GB/s)" for peer in layers))


if __name__ == "__main__":
    main()
