"""Prefill speed: time to first token (TTFT) and prefill tok/s for long prompts, ours against llama.cpp in the same
run, and the TPOT of running streams while a long prompt prefills.

Each engine gets the same random token-id prompts of --lengths tokens and generates one token (max_tokens=1), so
TTFT is the prefill. Every run changes the prompt's first token, so nothing comes from a prefix cache (ours) or a
kept context (llama.cpp, reset between runs too); a warm-up run of the shortest length goes first. The table gives
the best of --repeats runs and ours / llama.cpp's prefill rate. Peers:
  ours       inferplug's in-process backend, one row per --profiles entry (default: fp16 weights, and int4)
  llama.cpp  llama-cpp-python on the same GGUF file, --threads threads, n_batch 512

--streams N adds: N greedy streams decoding alone (their median TPOT), then the same with a
--stream-prompt-tokens prompt arriving among them (their mean TPOT while it prefills, and their longest gap: one
prefill chunk's step), for each --chunks size (the profile's limits.max_num_batched_tokens, set through
INFERPLUG_LIMITS__MAX_NUM_BATCHED_TOKENS) and each --caps value (limits.max_prefill_tokens_while_decoding: the
prefill tokens a step may carry beside decode rows; 0 none).

    .venv/bin/python bench/prefill.py --lengths 512,2048,8000 --json prefill-result.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time

from inferplug.benchmark.machine import machine

THREADS = os.cpu_count() or 1
CHUNK_ENV = "INFERPLUG_LIMITS__MAX_NUM_BATCHED_TOKENS"  # the profile's limits.max_num_batched_tokens
CAP_ENV = "INFERPLUG_LIMITS__MAX_PREFILL_TOKENS_WHILE_DECODING"


def prompt(length: int, run: int, vocab: int) -> list[int]:
    """`length` token ids, the same for every run but the first, which changes per run (no cache hits)."""
    import random

    rng = random.Random(length)
    ids = [rng.randrange(100, vocab) for _ in range(length)]
    ids[0] = 100 + run % (vocab - 100)
    return ids


def ttft_ours(backend, ids: list[int]) -> float:
    from inferplug.types import Request, SamplingParams

    request = Request(prompt=ids, params=SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
    start = time.perf_counter()
    for event in backend.stream_sync(request):
        if event.token_ids:
            return time.perf_counter() - start
    raise RuntimeError("no token came back")


def llama_cpp_runner(gguf, context: int, threads: int):
    from llama_cpp import Llama

    llm = Llama(model_path=str(gguf), n_ctx=context, n_threads=threads, n_threads_batch=threads, n_batch=512,
                verbose=False)

    def ttft(ids: list[int]) -> float:
        llm.reset()
        start = time.perf_counter()
        next(iter(llm.create_completion(ids, max_tokens=1, temperature=0.0, stream=True)))
        return time.perf_counter() - start

    return ttft


def measure(name: str, ttft, lengths: list[int], repeats: int, vocab: int, run0: int) -> list[dict]:
    ttft(prompt(min(lengths), run0, vocab))  # warm-up: kernels built, pools touched
    rows = []
    for length in lengths:
        times = [ttft(prompt(length, run0 + 1 + r, vocab)) for r in range(repeats)]
        best = min(times)
        rows.append({"engine": name, "prompt_tokens": length, "ttft_s": best, "ttft_s_all": times,
                     "prefill_tok_s": length / best})
        print(f"{name:>28} {length:>6} tokens: TTFT {best:7.2f} s, {length / best:7.1f} tok/s", flush=True)
    return rows


def decode_under_prefill(backend, profile: str, chunk: int, cap: int, args, vocab: int, run0: int) -> dict:
    alone = backend.run_sync(stream_tpot(backend, args.streams, args.stream_output_len, None, vocab))
    long_prompt = prompt(args.stream_prompt_tokens, run0 + chunk, vocab)
    busy = backend.run_sync(stream_tpot(backend, args.streams, args.stream_output_len, long_prompt, vocab))
    ratio = (busy["mean_during_prefill_ms"] or 0) / alone["median_ms"]
    print(f"{profile}, {chunk}-token chunks, {cap} beside decodes: {args.streams} streams' TPOT {alone['median_ms']:.1f} ms alone; while a "
          f"{args.stream_prompt_tokens}-token prompt prefills (TTFT {busy['prefill_s']:.2f} s): mean "
          f"{busy['mean_during_prefill_ms'] or 0:.1f} ms ({ratio:.2f}x), longest gap {busy['max_ms']:.1f} ms", flush=True)
    return {"profile": profile, "chunk_tokens": chunk, "prefill_cap_while_decoding": cap, "streams": args.streams,
            "prefill_tokens": args.stream_prompt_tokens, "alone": alone, "under_prefill": busy, "tpot_ratio": ratio}


async def stream_tpot(backend, streams: int, output_len: int, long_prompt: list[int] | None, vocab: int) -> dict:
    """The inter-token gaps (ms) of `streams` greedy streams after their first decode step: their median and max;
    with long_prompt, which arrives once they all decode, the mean of the gaps that end while it prefills."""
    from inferplug.types import Request, SamplingParams

    decoding = asyncio.Event()
    started, window = 0, []

    async def stream(i: int) -> list[tuple[float, float]]:
        nonlocal started
        request = Request(prompt=prompt(32, 10_000 + i, vocab), request_id=f"s{i}",
                          params=SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True))
        times = []
        async for event in backend.generate(request):
            if event.token_ids:
                times.append(time.perf_counter())
                started += len(times) == 2
                if started == streams:
                    decoding.set()
        return [(b, (b - a) * 1000) for a, b in zip(times[1:], times[2:])]

    async def long_request():
        await decoding.wait()
        window.append(time.perf_counter())
        request = Request(prompt=long_prompt, request_id="long", params=SamplingParams(temperature=0.0, max_tokens=1))
        async for _ in backend.generate(request):
            pass
        window.append(time.perf_counter())

    results = await asyncio.gather(*[stream(i) for i in range(streams)], *([long_request()] if long_prompt else []))
    gaps = [g for per in results[:streams] for g in per]
    during = [ms for end, ms in gaps if window and window[0] < end <= window[1] + 1e-3]
    return {"median_ms": statistics.median(ms for _, ms in gaps), "max_ms": max(ms for _, ms in gaps),
            "mean_during_prefill_ms": statistics.mean(during) if during else None,
            "prefill_s": window[1] - window[0] if window else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profiles", default="smollm2-135m,smollm2-135m-int4")
    parser.add_argument("--lengths", default="512,2048,8000", help="prompt lengths in tokens (SmolLM2's context: 8192)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=THREADS, help="llama.cpp's threads (ours: torch's)")
    parser.add_argument("--peers", default="llama.cpp", help="'llama.cpp', or '' for ours alone")
    parser.add_argument("--streams", type=int, default=0, help="also measure TPOT of N streams under a long prefill")
    parser.add_argument("--stream-prompt-tokens", type=int, default=4000)
    parser.add_argument("--chunks", default="512", help="prefill chunk sizes (tokens a step) for --streams")
    parser.add_argument("--caps", default="32", help="prefill tokens a step may carry beside decodes, for --streams")
    parser.add_argument("--stream-output-len", type=int, default=48)
    parser.add_argument("--json", default="prefill-result.json")
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]

    from inferplug.backends.registry import close_backend, get_backend
    from inferplug.profile import load_profile
    from inferplug.sources import ensure_local

    results, tpot = [], []
    run0 = int(time.time()) % 10_000  # another first token than earlier runs of this bench, too
    vocab = None
    for profile in args.profiles.split(","):
        backend = get_backend(profile)
        vocab = vocab or len(backend.tokenizer)
        results += measure(f"inferplug {profile}", lambda ids: ttft_ours(backend, ids), lengths, args.repeats, vocab, run0)
        close_backend(profile)  # closed and forgotten: the next get_backend loads afresh
        settings = [(int(c), int(k)) for c in args.chunks.split(",") if c for k in args.caps.split(",") if k]
        for chunk, cap in settings if args.streams else []:
            os.environ[CHUNK_ENV], os.environ[CAP_ENV] = str(chunk), str(cap)
            backend = get_backend(profile)
            tpot.append(decode_under_prefill(backend, profile, chunk, cap, args, vocab, run0))
            close_backend(profile)
            del os.environ[CHUNK_ENV], os.environ[CAP_ENV]
    if "llama.cpp" in args.peers.split(","):
        gguf = ensure_local(load_profile(args.profiles.split(",")[0]).model)
        ttft = llama_cpp_runner(gguf, max(lengths) + 16, args.threads)
        results += measure("llama.cpp (llama-cpp-python)", ttft, lengths, args.repeats, vocab, run0)

    peer = {r["prompt_tokens"]: r["prefill_tok_s"] for r in results if r["engine"].startswith("llama.cpp")}
    print("\n| engine | prompt tokens | TTFT (s) | prefill tok/s | / llama.cpp |\n|---|---:|---:|---:|---:|")
    for r in results:
        r["vs_llama_cpp"] = r["prefill_tok_s"] / peer[r["prompt_tokens"]] if r["prompt_tokens"] in peer else None
        ratio = f"{r['vs_llama_cpp']:.2f}x" if r["vs_llama_cpp"] else "n/a"
        print(f"| {r['engine']} | {r['prompt_tokens']} | {r['ttft_s']:.2f} | {r['prefill_tok_s']:.1f} | {ratio} |")
    with open(args.json, "w") as f:
        json.dump({"machine": machine(), "threads": args.threads, "results": results, "tpot_under_prefill": tpot}, f,
                  indent=2)


if __name__ == "__main__":
    main()
