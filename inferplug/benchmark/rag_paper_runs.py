"""bench/rag_cache.py --paper (and bench/rag_paper_7b.py): the CacheBlend-shaped workload (rag_paper_workload.py)
under each cache mode.

One request at a time, greedy answers of up to --answer-tokens tokens. Modes:
  none              canonical layout, nothing reused (salted apart): the full recompute
  prefix            what a plain app sends (retrieval order), automatic prefix caching
  rag               canonical layout + document hints, reused document KV as is
  rag/POLICY@F      the same, recomputing fraction F of each reused document ([cache] rag_recompute = POLICY)
Each cached mode first stores every chunk once (four warm-up requests of six chunks, with the mode's salt), as
an index precomputes them (TurboRAG, CacheBlend); each RAG configuration is an engine of its own. Reported: TTFT
mean/median/p90, prefill tokens (prompt - cached + recomputed) and planted-fact accuracy. Speed: what reuse does
to the answers is bench/rag_quality.py's judgment (issue 43).
"""

from __future__ import annotations

import json

from inferplug.benchmark.rag_paper_workload import make_paper_workload
from inferplug.benchmark.rag_runs import rag_request, run_one, summarize

POLICIES = ("deviation", "chunk_heads")


def _backend(profile_name: str, policy: str = "none", fraction: float = 0.0):
    from inferplug.backends.registry import get_backend
    from inferplug.profile import load_profile, with_tables

    cache = {"rag_document_cache": True, "rag_recompute": policy, "rag_recompute_fraction": fraction}
    return get_backend(with_tables(load_profile(profile_name), cache=cache))


def _warm(backend, mode: str, workload) -> None:
    """Every chunk once, six to a request, under the mode's salt (rag_request's)."""
    for i in range(0, len(workload.chunks), 6):
        run_one(backend, rag_request(backend, mode, "warm up", workload.chunks[i:i + 6], 1))


def _run_mode(backend, mode: str, workload, max_tokens: int) -> list[dict]:
    rows = []
    for question, ids in zip(workload.questions, workload.retrieved):
        before = backend.stats().get("doc_cache_recomputed_tokens", 0)
        row = run_one(backend, rag_request(backend, mode, question, [workload.chunks[i] for i in ids], max_tokens))
        row["recomputed_tokens"] = backend.stats().get("doc_cache_recomputed_tokens", 0) - before
        rows.append(row)
    return rows


def _score(rows: list[dict], workload) -> dict:
    out = summarize(rows)
    out["recomputed_tokens"] = sum(r["recomputed_tokens"] for r in rows)
    out["prefill_tokens"] += out["recomputed_tokens"]
    named = [fact.lower() in r["text"].lower() for r, facts in zip(rows, workload.answers) for fact in facts]
    out["accuracy"] = sum(named) / len(named)  # planted facts named, of those asked
    return out


def run_paper(args) -> None:
    from inferplug.backends.registry import close_all

    workload = make_paper_workload(args.queries, num_entities=args.entities)
    results: dict[str, dict] = {}
    backend = _backend(args.profile)
    try:
        run_one(backend, rag_request(backend, "none", "warm up", workload.chunks[:2], 1))
        # rag_request's "recompute": the canonical layout, salted apart, no hints: a full prefill of each RAG prompt
        full = _run_mode(backend, "recompute", workload, args.answer_tokens)
        results["none"] = _score(full, workload)
        _report("none", results)
        if not args.no_prefix:
            _warm(backend, "prefix", workload)
            results["prefix"] = _score(_run_mode(backend, "prefix", workload, args.answer_tokens), workload)
            _report("prefix", results)
        configs = [("none", 0.0)] + [(p, float(f)) for p in POLICIES for f in args.fractions.split(",") if f]
        for policy, fraction in configs:
            close_all()
            backend = _backend(args.profile, policy, fraction)
            _warm(backend, "rag", workload)
            name = "rag" if policy == "none" else f"rag/{policy}@{fraction:.2f}"
            results[name] = _score(_run_mode(backend, "rag", workload, args.answer_tokens), workload)
            _report(name, results)
    finally:
        close_all()
    report = {"workload": {"shape": "paper", "chunks": len(workload.chunks), "queries": len(workload.questions),
                           "top_k": 6, "mean_prompt_tokens": results["none"]["prompt_tokens"] // len(workload.questions),
                           "answer_tokens": args.answer_tokens},
              "modes": results}
    print_paper_table(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


def _report(name: str, results: dict) -> None:
    print(f"{name:>22}: " + ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                                      for k, v in results[name].items()), flush=True)


def print_paper_table(report: dict) -> None:
    modes = report["modes"]
    base = modes.get("prefix", modes["none"])["mean_ttft_ms"]
    print(f"\nRAG caching, paper-shaped workload: {report['workload']}")
    print(f"| mode | mean TTFT ms | median | p90 | {'prefix' if 'prefix' in modes else 'none'} / mode | prefill tokens | recomputed | accuracy |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in modes.items():
        print(f"| {name} | {r['mean_ttft_ms']:.0f} | {r['median_ttft_ms']:.0f} | {r['p90_ttft_ms']:.0f} | "
              f"{base / r['mean_ttft_ms']:.2f}x | {r['prefill_tokens']} | {r['recomputed_tokens']} | "
              f"{100 * r['accuracy']:.0f}% |")
