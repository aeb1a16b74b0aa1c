"""Integration overhead: LangChain's and LlamaIndex's batch paths vs the engine's own batch, same prompts, same run.

Peers (each generates exactly --max-tokens tokens per prompt, greedy, ignore_eos):
  engine      inferplug.llm.LLM.chat: the engine stepped directly, all prompts added at once
  backend     the native backend's async generate, all requests in flight at once
  langchain   ChatInferPlug(...).batch(prompts)
  lc_abatch   await ChatInferPlug(...).abatch(prompts)
  llamaindex  await asyncio.gather(*(InferPlug(...).achat(m) for m in chats)), LlamaIndex's concurrent idiom
Reports output tokens/s (median of --repeats, peers interleaved) and each peer / engine.

    .venv/bin/python bench/langchain_batch.py --prompts 32 --max-tokens 64 --json langchain-batch.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
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
    try:
        for _ in range(args.repeats):
            for name, fn in peers.items():
                start = time.perf_counter()
                produced = fn()
                elapsed = time.perf_counter() - start
                if produced != total_tokens:
                    raise RuntimeError(f"{name} produced {produced} tokens, expected {total_tokens}")
                rates[name].append(produced / elapsed)
                print(f"{name:>10}: {produced / elapsed:8.1f} tok/s", flush=True)
    finally:
        close_all()
    report = {"prompts": args.prompts, "max_tokens": args.max_tokens, "repeats": args.repeats,
              "median_tok_per_s": {k: statistics.median(v) for k, v in rates.items()}, "runs": rates}
    med = report["median_tok_per_s"]
    report["over_engine"] = {name: rate / med["engine"] for name, rate in med.items()}
    print(f"\nbatch of {args.prompts} x {args.max_tokens} tokens, median output tok/s (share of the engine's):")
    for name, rate in med.items():
        print(f"  {name:<11}{rate:10.1f}   {report['over_engine'][name]:.2f}")
    print("  target: every integration >= 0.90 of the engine")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
