"""RAG prompt caching: TTFT and prefill tokens for no caching, plain prefix caching and RAG-aware caching.

Same engine, same queries, same retrieved chunks (inferplug/benchmark/rag_workload.py: >= 200 chunks, >= 200
Zipf-popular queries, top-4 BM25), one request at a time so TTFT is pure prefill:
  (a) none     every request salted apart: nothing is reused
  (b) prefix   the prompt a plain RAG app sends (chunks in retrieval order), automatic prefix caching
  (c) rag      inferplug.rag layout (chunks in canonical order) + document cache hints (Request.documents)
Each mode has its own cache salt, so no mode reuses another's blocks. Then the quality check:
greedy answers with reused document KV against full recompute of the same prompt (token agreement).

    INFERPLUG_DTYPE=bfloat16 .venv/bin/python bench/rag_cache.py --queries 200 --json rag-cache.json
(bf16 for speed on CPUs with AVX512_BF16/AMX; the agreement check then includes bf16 rounding.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from inferplug.benchmark.rag_workload import make_workload  # noqa: E402
from inferplug.rag import DEFAULT_SYSTEM, document_spans, rag_messages  # noqa: E402
from inferplug.types import Request, SamplingParams  # noqa: E402


def plain_messages(question: str, docs: list[str]) -> list[dict[str, str]]:
    """What a plain RAG app sends: the same system text, chunks in retrieval order."""
    context = "\n\n".join(docs)
    return [{"role": "system", "content": f"{DEFAULT_SYSTEM}\n\nContext documents:\n\n{context}"},
            {"role": "user", "content": question}]


def rag_request(backend, mode: str, question: str, docs: list[str], max_tokens: int) -> Request:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    if mode == "none":
        return Request(messages=plain_messages(question, docs), params=params, cache_salt=uuid.uuid4().hex)
    if mode == "prefix":
        return Request(messages=plain_messages(question, docs), params=params, cache_salt="mode-prefix")
    messages = rag_messages(question, docs)
    spans = document_spans(backend.apply_chat_template(messages), docs)
    salt = "mode-rag" if mode == "rag" else uuid.uuid4().hex  # "recompute": same layout, nothing reused
    return Request(messages=messages, params=params, documents=spans if mode == "rag" else None, cache_salt=salt)


def run_one(backend, request: Request) -> dict:
    start = time.perf_counter()
    ttft, tokens, text, usage = None, [], "", None
    for event in backend.stream_sync(request):
        if ttft is None and event.token_ids:
            ttft = time.perf_counter() - start
        tokens += event.token_ids
        text += event.text
        usage = event.usage or usage
    return {"ttft_s": ttft, "tokens": tokens, "text": text, "prompt_tokens": usage.prompt_tokens,
            "cached_tokens": usage.cached_tokens}


def summarize(rows: list[dict]) -> dict:
    ttfts = sorted(r["ttft_s"] for r in rows)
    return {
        "requests": len(rows),
        "mean_ttft_ms": 1000 * statistics.fmean(ttfts),
        "median_ttft_ms": 1000 * statistics.median(ttfts),
        "p90_ttft_ms": 1000 * ttfts[min(len(ttfts) - 1, int(0.9 * len(ttfts)))],
        "prompt_tokens": sum(r["prompt_tokens"] for r in rows),
        "prefill_tokens": sum(r["prompt_tokens"] - r["cached_tokens"] for r in rows),
        "cached_tokens": sum(r["cached_tokens"] for r in rows),
    }


def agreement(backend, workload, n: int, max_tokens: int) -> dict:
    """Greedy answers with reused document KV vs full recompute of the identical prompt."""
    exact, prefix_frac = 0, []
    for question, ids in list(zip(workload.queries, workload.retrieved))[:n]:
        docs = [workload.chunks[i] for i in ids]
        reused = run_one(backend, rag_request(backend, "rag", question, docs, max_tokens))["tokens"]
        full = run_one(backend, rag_request(backend, "recompute", question, docs, max_tokens))["tokens"]
        same = next((i for i, (a, b) in enumerate(zip(reused, full)) if a != b), min(len(reused), len(full)))
        exact += reused == full
        prefix_frac.append(same / max(len(full), 1))
    return {"queries": n, "max_tokens": max_tokens, "exact_match_rate": exact / n,
            "mean_agreeing_prefix": statistics.fmean(prefix_frac)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="smollm2-135m")
    ap.add_argument("--chunks", type=int, default=240)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--agreement-queries", type=int, default=40)
    ap.add_argument("--answer-tokens", type=int, default=24)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--paper", action="store_true",
                    help="the CacheBlend-shaped workload (inferplug/benchmark/rag_paper_workload.py) with each "
                         "recompute policy")
    ap.add_argument("--fractions", default="0.05,0.15,0.30", help="--paper: the recompute fractions tried")
    ap.add_argument("--no-prefix", action="store_true", help="--paper: skip the prefix-caching mode")
    ap.add_argument("--entities", type=int, default=12, help="--paper: workshops (and people): 2x this many chunks")
    args = ap.parse_args()
    if args.paper:
        from rag_paper_bench import run_paper

        run_paper(args, rag_request, run_one, summarize)
        return

    from inferplug.backends.registry import close_all, get_backend

    workload = make_workload(num_chunks=args.chunks, num_queries=args.queries)
    backend = get_backend(args.profile)
    try:
        run_one(backend, rag_request(backend, "none", "warm up", workload.chunks[:4], 1))
        results = {}
        for mode in ("none", "prefix", "rag"):
            rows = []
            for n, (q, ids) in enumerate(zip(workload.queries, workload.retrieved), 1):
                rows.append(run_one(backend, rag_request(backend, mode, q, [workload.chunks[i] for i in ids], 1)))
                if n % 50 == 0:
                    print(f"  {mode}: {n}/{len(workload.queries)}", flush=True)
            results[mode] = summarize(rows)
            print(f"{mode:>7}: " + ", ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                                             for k, v in results[mode].items()), flush=True)
        quality = agreement(backend, workload, args.agreement_queries, args.answer_tokens)
        stats = backend.stats()
    finally:
        close_all()
    report = {
        "workload": {"chunks": len(workload.chunks), "queries": len(workload.queries), "top_k": 4,
                     "distinct_chunks_retrieved": len({i for r in workload.retrieved for i in r})},
        "modes": results,
        "ratios": {"mean_ttft_none_over_rag": results["none"]["mean_ttft_ms"] / results["rag"]["mean_ttft_ms"],
                   "mean_ttft_prefix_over_rag": results["prefix"]["mean_ttft_ms"] / results["rag"]["mean_ttft_ms"],
                   "prefill_none_over_rag": results["none"]["prefill_tokens"] / max(results["rag"]["prefill_tokens"], 1)},
        "quality": quality,
        "engine": {k: v for k, v in stats.items() if k.startswith(("doc_cache", "prefix"))},
    }
    print_table(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


def print_table(report: dict) -> None:
    print(f"\nRAG caching, {report['workload']}")
    print(f"{'mode':<8}{'mean TTFT ms':>14}{'p90 TTFT ms':>13}{'prefill tok':>13}{'cached tok':>12}")
    for mode, r in report["modes"].items():
        print(f"{mode:<8}{r['mean_ttft_ms']:>14.1f}{r['p90_ttft_ms']:>13.1f}{r['prefill_tokens']:>13}"
              f"{r['cached_tokens']:>12}")
    print("ratios:", {k: round(v, 2) for k, v in report["ratios"].items()})
    print("answer quality (reused doc KV vs full recompute):", report["quality"])


if __name__ == "__main__":
    main()
