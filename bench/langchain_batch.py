"""Integration overhead: LangChain's and LlamaIndex's batch paths vs the engine's own batch, same prompts, same run.

Peers (each generates exactly --max-tokens tokens per prompt, greedy, ignore_eos):
  engine      inferplug.llm.LLM.chat: the engine stepped directly, all prompts added at once
  backend     the native backend's async generate, all requests in flight at once
  langchain   ChatInferPlug(...).batch(prompts)
  lc_abatch   await ChatInferPlug(...).abatch(prompts)
  llamaindex  await asyncio.gather(*(InferPlug(...).achat(m) for m in chats)), LlamaIndex's concurrent idiom
Reports output tokens/s (median of --repeats, peers interleaved) and each peer / engine, and, because wall
time on a loaded host hides overhead, what each peer costs the process: CPU seconds per 1,000 tokens and
context switches (thread hops and wake-ups) per request, from getrusage.

    .venv/bin/python bench/langchain_batch.py --prompts 32 --max-tokens 64 --json langchain-batch.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import time
from pathlib import Path

TOPICS = ["the ocean", "a lighthouse", "mountains", "a library", "the moon", "bread", "trains", "rain", "a forest",
          "clocks", "bees", "a market", "winter", "bridges", "a violin", "maps"]


def prompts_for(n: int) -> list[str]:
    return [f"Write a short story about {TOPICS[i % len(TOPICS)]} (version {i})." for i in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="smollm2-135m")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    from inferplug.backends.registry import close_all
    from inferplug.frontend.calls import generate_all
    from inferplug.llm import LLM
    from inferplug.types import Request, SamplingParams
    from langchain_inferplug import ChatInferPlug
    from llama_index.core.base.llms.types import ChatMessage
    from llama_index.llms.inferplug import InferPlug

    prompts = prompts_for(args.prompts)
    params = dict(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    total_tokens = args.prompts * args.max_tokens

    engine_llm = LLM(args.profile)
    chat = ChatInferPlug(profile=args.profile, temperature=0.0, max_tokens=args.max_tokens)
    backend = chat.backend
    conversations = [[{"role": "user", "content": p}] for p in prompts]

    def run_engine() -> int:
        outs = engine_llm.chat(conversations, SamplingParams(**params))
        return sum(len(o.outputs[0].token_ids) for o in outs)

    def run_backend() -> int:
        results = generate_all(backend, [Request(messages=c, params=SamplingParams(**params)) for c in conversations])
        return sum(len(r.token_ids) for r in results)

    def run_langchain() -> int:
        return sum(m.usage_metadata["output_tokens"] for m in chat.batch(prompts, ignore_eos=True))

    def run_lc_abatch() -> int:
        messages = asyncio.run(chat.abatch(prompts, ignore_eos=True))
        return sum(m.usage_metadata["output_tokens"] for m in messages)

    llama = InferPlug(profile=args.profile, temperature=0.0, max_tokens=args.max_tokens,
                      additional_kwargs={"ignore_eos": True})

    def run_llamaindex() -> int:
        async def all_chats() -> list:
            return await asyncio.gather(*(llama.achat([ChatMessage(role="user", content=p)]) for p in prompts))

        return sum(r.raw["usage"]["completion_tokens"] for r in asyncio.run(all_chats()))

    peers = {"engine": run_engine, "backend": run_backend, "langchain": run_langchain, "lc_abatch": run_lc_abatch,
             "llamaindex": run_llamaindex}
    for fn in peers.values():  # warm up (and fill the prefix caches equally)
        fn()
    rates: dict[str, list[float]] = {name: [] for name in peers}
    cpu: dict[str, list[float]] = {name: [] for name in peers}
    switches: dict[str, list[float]] = {name: [] for name in peers}
    try:
        for _ in range(args.repeats):
            for name, fn in peers.items():
                before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
                produced = fn()
                elapsed, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
                if produced != total_tokens:
                    raise RuntimeError(f"{name} produced {produced} tokens, expected {total_tokens}")
                rates[name].append(produced / elapsed)
                cpu_s = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
                cpu[name].append(1000 * cpu_s / produced)
                switches[name].append((after.ru_nvcsw + after.ru_nivcsw - before.ru_nvcsw - before.ru_nivcsw)
                                      / args.prompts)
                print(f"{name:>10}: {produced / elapsed:8.1f} tok/s  {cpu[name][-1]:6.2f} cpu s/1k tok  "
                      f"{switches[name][-1]:7.1f} switches/request", flush=True)
    finally:
        close_all()
    median = lambda runs: {k: statistics.median(v) for k, v in runs.items()}  # noqa: E731
    report = {"prompts": args.prompts, "max_tokens": args.max_tokens, "repeats": args.repeats,
              "median_tok_per_s": median(rates), "median_cpu_s_per_1k_tokens": median(cpu),
              "median_switches_per_request": median(switches),
              "runs": {"tok_per_s": rates, "cpu_s_per_1k_tokens": cpu, "switches_per_request": switches}}
    med, med_cpu = report["median_tok_per_s"], report["median_cpu_s_per_1k_tokens"]
    report["over_engine"] = {name: rate / med["engine"] for name, rate in med.items()}
    report["cpu_over_engine"] = {name: c / med_cpu["engine"] for name, c in med_cpu.items()}
    print(f"\nbatch of {args.prompts} x {args.max_tokens} tokens, medians (shares against the engine's):")
    print(f"  {'peer':<11}{'tok/s':>10}{'share':>8}{'cpu s/1k':>10}{'cpu x':>7}{'switches/req':>14}")
    for name, rate in med.items():
        print(f"  {name:<11}{rate:10.1f}{report['over_engine'][name]:8.2f}{med_cpu[name]:10.2f}"
              f"{report['cpu_over_engine'][name]:7.2f}{report['median_switches_per_request'][name]:14.1f}")
    print("  target: every integration >= 0.90 of the engine's tok/s")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
