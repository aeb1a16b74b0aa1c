"""RAG prompt caching: TTFT and prefill tokens for no caching, plain prefix caching and RAG-aware caching.

Same engine, same queries, same retrieved chunks (inferplug/benchmark/rag_workload.py: >= 200 chunks, >= 200
Zipf-popular queries, top-4 BM25), one request at a time so TTFT is pure prefill:
  (a) none     every request salted apart: nothing is reused
  (b) prefix   the prompt a plain RAG app sends (chunks in retrieval order), automatic prefix caching
  (c) rag      inferplug.rag layout (chunks in canonical order) + document cache hints (Request.documents)
Each mode has its own cache salt, so no mode reuses another's blocks. Speed only: bench/rag_quality.py judges
what reuse does to the answers (issue 43's gates).

    .venv/bin/python bench/rag_cache.py --queries 200 --json rag-cache.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from inferplug.benchmark.rag_paper_runs import run_paper
from inferplug.benchmark.rag_runs import rag_request, run_one, summarize
from inferplug.benchmark.rag_workload import make_workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="smollm2-135m")
    ap.add_argument("--chunks", type=int, default=240)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--answer-tokens", type=int, default=24, help="--paper: greedy answer tokens a query generates")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--paper", action="store_true",
                    help="the CacheBlend-shaped workload (inferplug/benchmark/rag_paper_workload.py) with each "
                         "recompute policy")
    ap.add_argument("--fractions", default="0.05,0.15,0.30", help="--paper: the recompute fractions tried")
    ap.add_argument("--no-prefix", action="store_true", help="--paper: skip the prefix-caching mode")
    ap.add_argument("--entities", type=int, default=12, help="--paper: workshops (and people): 2x this many chunks")
    args = ap.parse_args()
    if args.paper:
        run_paper(args)
        return

    from inferplug.backends.registry import close_all, get_backend
    from inferplug.profile import load_profile, with_tables

    workload = make_workload(num_chunks=args.chunks, num_queries=args.queries)
    backend = get_backend(with_tables(load_profile(args.profile), cache={"rag_document_cache": True}))
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


if __name__ == "__main__":
    main()
