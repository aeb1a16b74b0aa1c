"""Sampled decoding at the default profile (temperature 0.7, top_p 0.9): what the sampler costs a step.

The engine's sampler (engine/sampler.py) cuts top-p among the tokens near the top logit (engine/top_p.py) and draws
among the kept tokens. Its reference is the plain way, which it falls back to for a flat row: a stable sort of the
whole vocabulary for the cut and a multinomial over all of it for the draw. Both run in the same engine, taking
turns each round, on the same seeded streams; the output is tokens/s of all streams together.

    .venv/bin/python bench/sampling.py [--profile smollm2-135m] [--streams 16] [--tokens 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import inferplug.engine.sampler as sampler
from inferplug import LLM
from inferplug.engine.top_p import _drop_by_full_sort
from inferplug.types import SamplingParams

WAYS = {
    "whole vocabulary: stable sort + multinomial": (_drop_by_full_sort,
                                                     lambda probs, g: int(torch.multinomial(probs, 1, generator=g))),
    "near the top: the cut and the draw (engine default)": (sampler.drop_top_p_tail, sampler._draw),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="smollm2-135m")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    llm = LLM(args.profile)
    prompts = [f"Write a short story about a lighthouse keeper, number {i}." for i in range(args.streams)]
    params = SamplingParams(temperature=0.7, top_p=0.9, max_tokens=args.tokens, ignore_eos=True, seed=1)
    llm.generate(prompts[:2], SamplingParams(max_tokens=4))  # warm-up
    rates: dict[str, list[float]] = {name: [] for name in WAYS}
    for _ in range(args.rounds):
        for name, (cut, draw) in WAYS.items():
            sampler.drop_top_p_tail, sampler._draw = cut, draw
            started = time.perf_counter()
            outputs = llm.generate(prompts, params)
            tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
            rates[name].append(tokens / (time.perf_counter() - started))
    base = statistics.median(rates[next(iter(WAYS))])
    print(f"{args.streams} streams x {args.tokens} tokens, temperature 0.7, top_p 0.9, profile {args.profile}")
    print("| sampler | tok/s (median) | rounds | / whole vocabulary |\n|---|---:|---|---:|")
    for name, values in rates.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.1f} | {', '.join(f'{v:.1f}' for v in values)} | {median / base:.2f}x |")


if __name__ == "__main__":
    main()
