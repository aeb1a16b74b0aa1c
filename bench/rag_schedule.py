"""Cache-aware scheduling under concurrent clients (issue 28, item 4): FIFO against `[cache] schedule =
"cache_aware"` on the paper-shaped workload (inferplug/benchmark/rag_paper_workload.py), RAG layout with document
hints.

Two arrival modes. Closed loop (default): --clients clients share --queries questions (client i sends questions
i, i + clients, ...); each sends its next as soon as its last answer ends, so requests queue while others
prefill, but a request arrives at another step under each schedule. Open loop (--open-loop): request i arrives at
a step fixed before the run (a seeded Poisson process, --mean-gap steps between arrivals), the same under both
schedules, so each request's wait can be compared with its FIFO wait one by one (what the 2x bound is about).
The bench drives the engine itself (LLM(...).engine) and adds requests between steps, so a run is the same step
for step whatever the machine's load: waits are counted in engine steps (exact) as well as in milliseconds
(noisy). The document cache starts cold: the first requests compute their documents, later ones find more of
theirs cached, which is when the order matters. Each schedule is an engine of its own, from the same profile with
`[cache] schedule` and `memory` set (the CPU's default pool holds one context; --memory holds every client's), and
--prefill-cap sets `[limits] max_prefill_tokens_while_decoding` (0: no cap). Reported per schedule: TTFT (arrival
to first token, queueing included) mean/median/p90/max in ms and in steps, prompt tokens computed, requests
admitted out of arrival order, requests in the system on average (open loop); then, request by request,
cache-aware's TTFT over FIFO's and whether the greedy answers are the same.

    nice .venv/bin/python bench/rag_schedule.py --clients 8 --queries 32 --json rag-schedule.json
    nice .venv/bin/python bench/rag_schedule.py --open-loop --mean-gap 12 --queries 24 --json rag-open.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from inferplug.benchmark.rag_paper_workload import make_paper_workload
from inferplug.rag import document_spans, rag_messages
from inferplug.types import Request, SamplingParams

SCHEDULES = ("fifo", "cache_aware")


def _engine(profile_name: str, schedule: str, memory: str, prefill_cap: int | None):
    from inferplug.llm import LLM
    from inferplug.profile import load_profile, with_tables

    cache = {"schedule": schedule, "memory": memory, "rag_document_cache": True}
    limits = {"max_prefill_tokens_while_decoding": prefill_cap}
    return LLM(with_tables(load_profile(profile_name), cache=cache, limits=limits)).engine


def poisson_arrivals(n: int, mean_gap: float, seed: int) -> list[int]:
    """The engine step each of n requests arrives at: exponential gaps of mean_gap steps, from step 0."""
    rng, at, steps = random.Random(seed), 0.0, []
    for _ in range(n):
        steps.append(int(at))
        at += rng.expovariate(1 / mean_gap)
    return steps


def _request(engine, i: int, question: str, docs: list[str], max_tokens: int) -> Request:
    messages = rag_messages(question, docs)
    spans = document_spans(engine.render_chat(messages, None), docs)
    return Request(messages=messages, params=SamplingParams(temperature=0.0, max_tokens=max_tokens),
                   documents=spans, cache_salt="rag-schedule", request_id=f"q{i}")


def run_schedule(args, schedule: str, workload, arrivals: list[int] | None) -> tuple[list[dict], dict]:
    """arrivals: the step each request arrives at (open loop), or None: the closed loop of args.clients."""
    engine = _engine(args.profile, schedule, args.memory, args.prefill_cap)
    n = len(workload.questions)
    rows: list[dict] = [{"tokens": []} for _ in range(n)]

    def send(i: int) -> None:
        docs = [workload.chunks[c] for c in workload.retrieved[i]]
        engine.add_request(_request(engine, i, workload.questions[i], docs, args.answer_tokens))
        rows[i].update(sent=time.perf_counter(), sent_step=step)

    engine.add_request(Request(prompt="A warm-up line.", params=SamplingParams(max_tokens=1), request_id="warm"))
    while engine.has_unfinished():
        engine.step()
    step, due = 0, sorted(range(n), key=lambda i: arrivals[i]) if arrivals else []
    for client in ([] if arrivals else range(min(args.clients, n))):
        send(client)
    while engine.has_unfinished() or due:
        if due and not engine.has_unfinished():  # idle until the next arrival: its step, with nothing computed
            step = max(step, arrivals[due[0]])
        while due and arrivals[due[0]] <= step:
            send(due.pop(0))
        events = engine.step()
        step += 1
        for event in events:
            row = rows[int(event.request_id[1:])]
            if event.token_ids and "ttft_s" not in row:
                row.update(ttft_s=time.perf_counter() - row["sent"], ttft_steps=step - row["sent_step"])
            row["tokens"] += event.token_ids
            if event.usage is not None:
                row.update(prompt_tokens=event.usage.prompt_tokens, cached_tokens=event.usage.cached_tokens,
                           done_step=step)
                following = int(event.request_id[1:]) + args.clients
                if arrivals is None and following < n:
                    send(following)
    stats = engine.stats()
    ttfts, steps = sorted(r["ttft_s"] for r in rows), sorted(r["ttft_steps"] for r in rows)
    out = {"mean_ttft_ms": 1000 * statistics.fmean(ttfts), "median_ttft_ms": 1000 * statistics.median(ttfts),
           "p90_ttft_ms": 1000 * ttfts[int(0.9 * (n - 1))], "max_ttft_ms": 1000 * ttfts[-1],
           "mean_ttft_steps": statistics.fmean(steps), "median_ttft_steps": statistics.median(steps),
           "p90_ttft_steps": steps[int(0.9 * (n - 1))], "max_ttft_steps": steps[-1], "steps": step,
           "in_system": sum(r["done_step"] - r["sent_step"] for r in rows) / step,  # mean requests (Little)
           "prefill_tokens": sum(r["prompt_tokens"] - r["cached_tokens"] for r in rows),
           "admitted_out_of_order": stats["admitted_out_of_order"], "preemptions": stats["preemptions"]}
    return rows, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="smollm2-135m")
    ap.add_argument("--clients", type=int, default=8, help="closed loop: concurrent clients")
    ap.add_argument("--open-loop", action="store_true", help="fixed arrival steps (a seeded Poisson process)")
    ap.add_argument("--mean-gap", type=float, default=12.0, help="open loop: mean steps between arrivals")
    ap.add_argument("--seed", type=int, default=0, help="open loop: the arrival process's seed")
    ap.add_argument("--queries", type=int, default=32)
    ap.add_argument("--entities", type=int, default=16, help="workshops (and people): 2x this many chunks")
    ap.add_argument("--answer-tokens", type=int, default=24)
    ap.add_argument("--memory", default="1GiB", help="[cache] memory: the KV pool, for every client's context")
    ap.add_argument("--prefill-cap", type=int, default=None,
                    help="[limits] max_prefill_tokens_while_decoding (0: no cap; unset: the device's default)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    workload = make_paper_workload(args.queries, num_entities=args.entities)
    arrivals = poisson_arrivals(args.queries, args.mean_gap, args.seed) if args.open_loop else None
    rows, results = {}, {}
    for schedule in SCHEDULES:
        rows[schedule], results[schedule] = run_schedule(args, schedule, workload, arrivals)
        print(f"{schedule:>12}: " + ", ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                                          for k, v in results[schedule].items()), flush=True)
    pairs = list(zip(rows["cache_aware"], rows["fifo"]))
    ratios = [a["ttft_s"] / f["ttft_s"] for a, f in pairs]
    step_ratios = [a["ttft_steps"] / f["ttft_steps"] for a, f in pairs]
    worst = max(range(len(pairs)), key=step_ratios.__getitem__)
    load = {"open_loop_mean_gap_steps": args.mean_gap, "seed": args.seed} if args.open_loop else \
        {"closed_loop_clients": args.clients}
    report = {"workload": {"shape": "paper", "chunks": len(workload.chunks), "queries": len(workload.questions),
                           "answer_tokens": args.answer_tokens, "prefill_cap": args.prefill_cap, **load},
              "arrival_steps": arrivals,
              "schedules": results,
              "per_request": {"worst_ttft_ratio_cache_aware_over_fifo": max(ratios),
                              "median_ttft_ratio": statistics.median(ratios),
                              "worst_ttft_steps_ratio": step_ratios[worst],
                              "worst_request": f"q{worst}: {pairs[worst][0]['ttft_steps']} steps against FIFO's "
                                               f"{pairs[worst][1]['ttft_steps']}",
                              "median_ttft_steps_ratio": statistics.median(step_ratios),
                              "identical_answers": sum(a["tokens"] == f["tokens"] for a, f in pairs)},
              "steps_per_request": {name: [r["ttft_steps"] for r in rows[name]] for name in SCHEDULES},
              "mean_ttft_fifo_over_cache_aware": results["fifo"]["mean_ttft_ms"] / results["cache_aware"]["mean_ttft_ms"],
              "mean_ttft_steps_fifo_over_cache_aware":
                  results["fifo"]["mean_ttft_steps"] / results["cache_aware"]["mean_ttft_steps"],
              "max_ttft_cache_aware_over_fifo": results["cache_aware"]["max_ttft_ms"] / results["fifo"]["max_ttft_ms"]}
    print_table(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


def print_table(report: dict) -> None:
    print(f"\nCache-aware scheduling, {report['workload']}")
    print("| schedule | mean TTFT ms | p90 | max | mean TTFT steps | median | p90 | max | steps | in system |"
          " prefill tokens | out of order | preemptions |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, r in report["schedules"].items():
        print(f"| {name} | {r['mean_ttft_ms']:.0f} | {r['p90_ttft_ms']:.0f} | {r['max_ttft_ms']:.0f} | "
              f"{r['mean_ttft_steps']:.1f} | {r['median_ttft_steps']} | {r['p90_ttft_steps']} | "
              f"{r['max_ttft_steps']} | {r['steps']} | {r['in_system']:.1f} | {r['prefill_tokens']} | "
              f"{r['admitted_out_of_order']} | {r['preemptions']} |")
    print("fifo / cache_aware mean TTFT:", round(report["mean_ttft_fifo_over_cache_aware"], 2),
          "| in steps:", round(report["mean_ttft_steps_fifo_over_cache_aware"], 2),
          "| max TTFT cache_aware / fifo:", round(report["max_ttft_cache_aware_over_fifo"], 2),
          "| per request:", {k: round(v, 2) if isinstance(v, float) else v for k, v in report["per_request"].items()})
    for name, steps in report["steps_per_request"].items():
        print(f"{name} TTFT steps per request: {steps}")


if __name__ == "__main__":
    main()
