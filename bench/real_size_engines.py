"""One engine on one model file, in this process: bench/real_size.py starts it as a subprocess, so the peak RSS
(VmHWM) is this engine's alone, and an out-of-memory kill ends this process, not the bench.

    python bench/real_size_engines.py {inferplug PROFILE.toml | llama.cpp MODEL.gguf} --workload JSON [--load-only]

Each finished stage prints one line `RESULT {json}`, so the figures of earlier stages survive a later crash:
  load     load seconds (the engine ready), then the first token of a 16-token prompt (a cold file is read by then)
  prefill  --prefill-tokens tokens, one token out: TTFT, each run's first token changed (no cache hits)
  decode   one greedy stream of 32 prompt tokens, decode_tokens out: 1 / the median inter-token gap
  streams  `streams` such streams at once: all tokens / wall time (their prefills included), and per-stream TPOT
Both engines get the same token ids, greedy, EOS ignored.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from inferplug.benchmark.llama_cpp_engine import LlamaCpp
from inferplug.benchmark.machine import memory_bytes, version_of
from inferplug.benchmark.prefill_runs import ours_runner, prompt
from inferplug.benchmark.real_size_workload import Workload


class InferPlug:
    """inferplug through the backend registry, as a user's code gets it: get_backend(the profile's TOML)."""

    def __init__(self, profile: str, w: Workload) -> None:
        self.profile, self.w = profile, w

    def load(self) -> None:
        from inferplug.backends.registry import get_backend

        self.backend = get_backend(self.profile)

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[list[float]]:
        import asyncio

        from inferplug.types import Request, SamplingParams

        async def one(i: int, ids: list[int]) -> list[float]:
            params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
            stamps = []
            async for event in self.backend.generate(Request(prompt=ids, params=params, request_id=f"rs{i}")):
                if event.error:
                    raise RuntimeError(event.error)
                now = time.perf_counter()
                stamps += [now] * len(event.token_ids)
            return stamps

        async def every() -> list[list[float]]:
            return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))

        return self.backend.run_sync(every())

    def ttft(self, ids: list[int]) -> float:
        times, _ = ours_runner(self.backend)(ids, 1)  # the first token's time: the prefill
        return times[0]

    def facts(self) -> dict:
        plan = self.backend.plan
        facts = {"version": version_of("inferplug"), "dtype": getattr(plan, "dtype", None),
                 "weight_format": getattr(plan, "weight_format", None)}
        try:  # what each decode step streams, as loaded (doctor --bench reads the same)
            facts["decode_weight_bytes"] = self.backend.engine.engine.runner.model.decode_weight_bytes()
        except AttributeError:
            pass
        return facts


def emit(stage: str, **figures) -> None:
    print("RESULT " + json.dumps({"stage": stage, **figures}), flush=True)


def tpot_s(stamps: list[float]) -> float:
    """The median gap between a stream's tokens after its first (the first includes its prefill)."""
    return statistics.median(b - a for a, b in zip(stamps[1:], stamps[2:]))


def run(engine, w: Workload, load_only: bool) -> None:
    start = time.perf_counter()
    engine.load()
    loaded = time.perf_counter()
    engine.ttft(prompt(16, 0, w.vocab))
    emit("load", load_s=loaded - start, first_token_s=time.perf_counter() - start, rss=memory_bytes("VmHWM", "VmRSS"),
         **engine.facts())
    if load_only:
        return
    runs = [engine.ttft(prompt(w.prefill_tokens, 1 + r, w.vocab)) for r in range(w.repeats)]
    emit("prefill", ttft_s=statistics.median(runs), ttft_s_all=runs,
         prefill_tok_s=w.prefill_tokens / statistics.median(runs))
    one = engine.generate([prompt(w.stream_prompt_tokens, 10_000, w.vocab)], w.decode_tokens)[0]
    emit("decode", tokens=len(one), tpot_s=tpot_s(one), decode_tok_s=1 / tpot_s(one))
    prompts = [prompt(w.stream_prompt_tokens, 20_000 + i, w.vocab) for i in range(w.streams)]
    origin = time.perf_counter()
    stamps = engine.generate(prompts, w.decode_tokens)
    tokens, wall = sum(map(len, stamps)), max(s[-1] for s in stamps) - origin
    tpots = [tpot_s(s) for s in stamps]
    emit("streams", streams=w.streams, tokens=tokens, wall_s=wall, throughput_tok_s=tokens / wall,
         tpot_s_median=statistics.median(tpots), decode_tok_s=w.streams / statistics.median(tpots))
    emit("end", rss=memory_bytes("VmHWM", "VmRSS"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("engine", choices=("inferplug", "llama.cpp"))
    parser.add_argument("model", help="inferplug: the profile TOML; llama.cpp: the GGUF file")
    parser.add_argument("--workload", required=True, help="a Workload as JSON")
    parser.add_argument("--load-only", action="store_true")
    args = parser.parse_args()
    w = Workload(**json.loads(args.workload))
    engine = (InferPlug if args.engine == "inferplug" else LlamaCpp)(args.model, w)
    try:
        run(engine, w, args.load_only)
    except Exception as exc:  # the bench records it as this engine's row
        emit("error", error=f"{type(exc).__name__}: {exc}")
        sys.exit(1)


if __name__ == "__main__":
    main()
