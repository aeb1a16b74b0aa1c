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

from inferplug.benchmark.machine import memory_bytes, version_of
from inferplug.benchmark.prefill_runs import ours_runner, prompt
from inferplug.benchmark.real_size_workload import Workload


class LlamaCpp:
    """llama.cpp through llama-cpp-python's C API: one context of `streams` sequences (n_ctx = context each, not
    unified), n_batch 512, greedy argmax over the logits."""

    def __init__(self, path: str, w: Workload) -> None:
        self.path, self.w = path, w

    def load(self) -> None:
        import llama_cpp as lc

        self.lc = lc
        lc.llama_backend_init()
        self.model = lc.llama_model_load_from_file(self.path.encode(), lc.llama_model_default_params())
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {self.path}")
        params = lc.llama_context_default_params()
        params.n_ctx, params.n_seq_max, params.kv_unified = self.w.context * self.w.streams, self.w.streams, False
        params.n_batch = params.n_ubatch = 512
        params.n_threads = params.n_threads_batch = self.w.threads
        self.ctx = lc.llama_init_from_model(self.model, params)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create its context")
        self.n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))
        self.batch = lc.llama_batch_init(512, 0, 1)

    def _decode(self, rows: list[tuple[int, int, int, bool]]) -> None:
        """rows: (token, position, sequence, wants logits), at most 512."""
        b = self.batch
        for i, (token, pos, seq, logits) in enumerate(rows):
            b.token[i], b.pos[i], b.n_seq_id[i], b.seq_id[i][0], b.logits[i] = token, pos, 1, seq, logits
        b.n_tokens = len(rows)
        if self.lc.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama_decode failed (the KV cache is full?)")

    def _argmax(self, i: int) -> int:
        import numpy as np

        return int(np.ctypeslib.as_array(self.lc.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,)).argmax())

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[list[float]]:
        """Every prompt at once, each its own sequence: the time of each generated token, per stream."""
        self.lc.llama_memory_clear(self.lc.llama_get_memory(self.ctx), True)
        rows = [(t, pos, seq, pos == len(p) - 1) for seq, p in enumerate(prompts) for pos, t in enumerate(p)]
        last, stamps = [0] * len(prompts), [[] for _ in prompts]
        for start in range(0, len(rows), 512):  # prefill, 512 tokens a batch
            chunk = rows[start:start + 512]
            self._decode(chunk)
            for i, (_, _, seq, logits) in enumerate(chunk):
                if logits:
                    last[seq] = self._argmax(i)
                    stamps[seq].append(time.perf_counter())
        for step in range(max_tokens - 1):
            self._decode([(last[s], len(p) + step, s, True) for s, p in enumerate(prompts)])
            for s in range(len(prompts)):
                last[s] = self._argmax(s)
                stamps[s].append(time.perf_counter())
        return stamps

    def ttft(self, ids: list[int]) -> float:
        start = time.perf_counter()
        return self.generate([ids], 1)[0][0] - start

    def facts(self) -> dict:
        return {"version": version_of("llama_cpp_python")}


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
