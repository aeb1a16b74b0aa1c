"""The chunked gated delta rule (a Qwen3.5 DeltaNet layer's prompt rows) on the CPU, same process, same inputs:
inferplug's C++ kernel on each kernel set it has (kernels/cpu/delta_chunks.h), its torch specification
(kernels/delta_rule_ref.py, what it ran before), and HF transformers' torch_chunk_gated_delta_rule (what HF's
Qwen3.5 runs without flash-linear-attention). One layer at Qwen3.5-9B's geometry (32 value heads of 128, q and k
128 wide); the engines take turns in every repeat and the table gives medians and each one's time over the C++
kernel's on the set the engine runs (the torch form's where the kernels cannot run), and the largest difference
from the float64 specification.

    .venv/bin/python bench/delta_rule.py --threads 2 --tokens 512,2048,8192 --json delta-rule.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

from inferplug.kernels import cpu as cpu_kernels
from inferplug.kernels.delta_rule_ref import CHUNK, chunked_delta_rule

HEADS, KEY_DIM, VALUE_DIM = 32, 128, 128


def inputs(n: int):
    gen = torch.Generator().manual_seed(n)
    q, k = (torch.nn.functional.normalize(torch.randn(n, HEADS, KEY_DIM, generator=gen), dim=-1) for _ in "qk")
    v = torch.randn(n, HEADS, VALUE_DIM, generator=gen)
    g, beta = -torch.rand(n, HEADS, generator=gen) * 0.2, torch.rand(n, HEADS, generator=gen)
    return q * KEY_DIM**-0.5, k, v, g, beta, torch.randn(HEADS, KEY_DIM, VALUE_DIM, generator=gen) * 0.1


def engines() -> dict:
    ops = cpu_kernels.ops()

    def kernel(isa):
        def run(*args):
            cpu_kernels.set_isa(isa)
            return ops.chunked_delta_rule_(*args, CHUNK)
        return run

    def hf(q, k, v, g, beta, state):  # HF scales q itself, by 1 / sqrt(key dim); [batch, tokens, heads, dim]
        out, after = torch_chunk_gated_delta_rule(
            (q * KEY_DIM**0.5).unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), g.unsqueeze(0), beta.unsqueeze(0),
            initial_state=state.unsqueeze(0), output_final_state=True)
        return out.squeeze(0), after.squeeze(0)

    isas = [] if ops is None else sorted(cpu_kernels.supported_isas(), key=lambda isa: isa != cpu_kernels.chosen_isa())
    found = {f"inferplug C++ ({isa})": kernel(isa) for isa in isas}  # the set the engine runs first: the base
    return found | {"inferplug torch form": chunked_delta_rule, "HF transformers": hf}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", default="512,2048,8192")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    runs = engines()
    rows = []
    for n in (int(t) for t in args.tokens.split(",")):
        data = inputs(n)
        exact_out, exact_state = chunked_delta_rule(*(t.double() for t in data))
        times = {name: [] for name in runs}
        error = {}
        for name, run in runs.items():
            out, state = run(*data)  # warm-up, and the difference from float64
            error[name] = max((out.double() - exact_out).abs().max().item(),
                              (state.double() - exact_state).abs().max().item())
        for _ in range(args.repeats):
            for name, run in runs.items():
                start = time.perf_counter()
                run(*data)
                times[name].append(time.perf_counter() - start)
        first = next(iter(runs))
        base = statistics.median(times[first])
        for name in runs:
            median = statistics.median(times[name])
            rows.append(dict(tokens=n, engine=name, ms=median * 1e3, us_per_token=median / n * 1e6,
                             over_first=median / base, max_abs_error=error[name]))
    if cpu_kernels.ops() is not None:
        cpu_kernels.set_isa(cpu_kernels.chosen_isa())
    print(f"| tokens | engine | ms a layer | us a token | time / {next(iter(runs))}'s | max abs diff from fp64 |")
    print("|---:|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['tokens']} | {r['engine']} | {r['ms']:.1f} | {r['us_per_token']:.1f} | {r['over_first']:.2f}x | "
              f"{r['max_abs_error']:.1e} |")
    if args.json:
        args.json.write_text(json.dumps(dict(threads=args.threads, heads=HEADS, key_dim=KEY_DIM,
                                             value_dim=VALUE_DIM, rows=rows), indent=1))


if __name__ == "__main__":
    main()
