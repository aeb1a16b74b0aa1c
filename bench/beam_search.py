"""Beam search against greedy decoding on SmolLM2-135M, same engine, same prompt, same run.

One chat prompt, `--max-tokens` tokens out (ignore_eos, so every run decodes the same length unless the beams
finish early), greedy and then beam widths `--widths`, each the median of `--repeats` runs. Engines: each
`--profiles` entry as the native backend builds it. Prints the seconds and the ratio to greedy.

    .venv/bin/python bench/beam_search.py --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

PROMPT = "Translate to French: the cat sleeps on the warm mat by the window."


def build(profile_name: str, threads: int):
    from inferplug.backends.native import build_engine
    from inferplug.hardware import probe
    from inferplug.profile import load_profile
    from inferplug.resolver import resolve

    profile = load_profile(profile_name)
    profile.native.num_threads = threads
    return build_engine(profile, resolve(profile, probe()))


def seconds(engine, prompt: list[int], params, request_id: str) -> float:
    from inferplug.types import Request

    start = time.perf_counter()
    engine.add_request(Request(prompt=prompt, params=params, request_id=request_id))
    while engine.has_unfinished():
        engine.step()
    return time.perf_counter() - start


def main() -> None:
    from inferplug.types import Request, SamplingParams

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profiles", default="smollm2-135m,smollm2-135m-int4")
    ap.add_argument("--widths", default="2,4,8")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{'profile':<20}{'search':<10}{'seconds':>9}{'x greedy':>10}")
    for name in args.profiles.split(","):
        engine = build(name, args.threads)
        prompt = engine.encode(Request(messages=[{"role": "user", "content": PROMPT}]))[0]
        runs = {"greedy": SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)}
        runs |= {f"beam {k}": SamplingParams(use_beam_search=True, beam_width=int(k), max_tokens=args.max_tokens,
                                             ignore_eos=True) for k in args.widths.split(",")}
        seconds(engine, prompt, runs["greedy"], "warm-up")
        base = None
        for label, params in runs.items():
            median = statistics.median(seconds(engine, prompt, params, f"{label}{i}") for i in range(args.repeats))
            base = base or median
            print(f"{name:<20}{label:<10}{median:>9.3f}{median / base:>9.2f}x")


if __name__ == "__main__":
    main()
