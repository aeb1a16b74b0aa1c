"""TPOT at 64 concurrent streams through the native backend, as a caller sees it (issue 30: output work off the
engine's critical path).

64 chat requests on one event loop, each streamed with Backend.stream_async, greedy, ignore_eos, the same output
length; a short prompt each. TPOT per stream is measured where the caller reads the events (the time from its
first token's event to its last, over its tokens - 1) and, for comparison, as the engine reports it (Event.timings);
and what the output stage costs a token, and so its share of a step at this many streams. Prints the medians and
writes JSON. The machine is noisy: quote medians of several rounds.

    .venv/bin/python bench/stream_tpot.py --streams 64 --tokens 32 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path


async def one_round(backend, streams: int, tokens: int, round_index: int) -> dict[str, float]:
    from inferplug.types import Request, SamplingParams

    async def one(i: int) -> tuple[float | None, float | None]:
        request = Request(messages=[{"role": "user", "content": f"Tell me about river number {i} in a few words."}],
                          params=SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True),
                          request_id=f"tpot-{round_index}-{i}")
        first = last = None
        count = 0
        engine_tpot = None
        async for event in backend.stream_async(request):
            if event.token_ids:
                last = time.perf_counter()
                first = first or last
                count += len(event.token_ids)
            if event.timings is not None:
                engine_tpot = event.timings.tpot
        return ((last - first) / (count - 1) if count > 1 else None), engine_tpot

    start = time.perf_counter()
    results = await asyncio.gather(*(one(i) for i in range(streams)))
    wall = time.perf_counter() - start
    caller = [r[0] for r in results if r[0] is not None]
    engine = [r[1] for r in results if r[1] is not None]
    return {"wall_s": wall, "tok_per_s": streams * tokens / wall, "caller_tpot_median_s": statistics.median(caller),
            "engine_tpot_median_s": statistics.median(engine)}


def output_stage_us_per_token(tokenizer, rounds: int = 20) -> float:
    """What the output stage costs a token (detokenizing, two stop strings), in microseconds: its share of a step
    is this times the streams, over the step's time."""
    from inferplug.stages.output import ChoiceOutput
    from inferplug.types import SamplingParams

    ids = tokenizer.encode("The model reads a long document about rivers, mountains and cities. " * 8)
    start = time.perf_counter()
    for _ in range(rounds):
        choice = ChoiceOutput("bench", 0, tokenizer, ids[:4], SamplingParams(stop=["\n\n", "User:"]), set(), 10**6)
        for token in ids:
            choice.on_token(token)
    return (time.perf_counter() - start) / (rounds * len(ids)) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="smollm2-135m")
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--label", default="", help="a name for this run in the JSON (e.g. before, after)")
    ap.add_argument("--out", default="stream_tpot.json")
    args = ap.parse_args()

    from inferplug.backends.registry import close_all, get_backend

    backend = get_backend(args.profile)
    try:
        asyncio.run(one_round(backend, 4, 4, -1))  # warm up: kernels, first allocations
        rounds = [asyncio.run(one_round(backend, args.streams, args.tokens, r)) for r in range(args.rounds)]
        output_us = output_stage_us_per_token(backend.tokenizer)
    finally:
        close_all()
    summary = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    summary["output_stage_us_per_token"] = output_us
    summary["output_stage_share_of_a_step"] = output_us * 1e-6 * args.streams / summary["engine_tpot_median_s"]
    print(f"| run | streams | tokens | caller TPOT ms | engine TPOT ms | tok/s | output stage us/token (share of a step) |"
          f"\n|---|---|---|---|---|---|---|\n"
          f"| {args.label or '-'} | {args.streams} | {args.tokens} | {summary['caller_tpot_median_s'] * 1e3:.1f} | "
          f"{summary['engine_tpot_median_s'] * 1e3:.1f} | {summary['tok_per_s']:.0f} | {output_us:.1f} "
          f"({summary['output_stage_share_of_a_step']:.1%}) |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"label": args.label, "args": vars(args), "rounds": rounds, "median": summary}, indent=2))


if __name__ == "__main__":
    main()
