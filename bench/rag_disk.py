"""Document KV precomputed to disk (TurboRAG), then reused by a fresh process: TTFT against no cache.

Three processes, one after another, on the same profile, corpus and queries (written here, offline: documents of
~400 tokens with a planted fact each; each query retrieves 6 of them in random order, the RAG layout puts them in
canonical order, as the integrations do):
  precompute  LLM.precompute_documents(corpus) into a fresh disk tier; then every query with in-memory reuse, whose
              greedy answers the fresh process must repeat token for token (it reads the same KV back)
  disk        a fresh process: every query, its documents' KV loaded from the disk tier
  none        a fresh process: every query computed in full, nothing reused (a salt of its own each, no hints)
Each timed process first runs one unrelated warm-up request (first-call costs are not TTFT). TTFT is from
add_request to the first token, one request at a time.

    .venv/bin/python bench/rag_disk.py --queries 8 --json rag-disk.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

NAMES = ["Arden", "Eskar", "Morrow", "Tallis", "Quen", "Brisa", "Odell", "Varn", "Liss", "Corrin", "Hale", "Pyke",
         "Rune", "Sable", "Tern", "Ulm", "Wren", "Yarl", "Zeno", "Fenn", "Gale", "Ives", "Jorn", "Kest"]
WORDS = ["river", "market", "copper", "lantern", "harbor", "orchard", "bridge", "mill", "quarry", "tower", "garden",
         "archive", "forge", "meadow", "valley", "chapel", "granary", "wharf", "school", "library"]
VERBS = ["repaired", "painted", "measured", "guarded", "rebuilt", "visited", "mapped", "opened", "cleaned", "sold"]


def corpus(num_docs: int, seed: int) -> tuple[list[str], list[str]]:
    """num_docs documents of ~400 tokens, each with one planted fact, and each fact's code."""
    rng = random.Random(seed)
    docs, codes = [], []
    for i in range(num_docs):
        name, code = NAMES[i % len(NAMES)] + (str(i // len(NAMES)) if i >= len(NAMES) else ""), str(rng.randint(1000, 9999))
        lines = [f"In the year {rng.randint(1200, 1900)} the people of {rng.choice(NAMES)} {rng.choice(VERBS)} the old "
                 f"{rng.choice(WORDS)} near the {rng.choice(WORDS)}, and they kept a record of it." for _ in range(13)]
        lines.insert(rng.randint(2, 11), f"The secret code of the {name} archive is {code}.")
        docs.append(" ".join(lines))
        codes.append((name, code))
    return docs, codes


def queries(docs: list[str], facts, num_queries: int, top_k: int, seed: int) -> list[tuple[str, list[str], str]]:
    rng = random.Random(seed + 1)
    out = []
    for _ in range(num_queries):
        picked = rng.sample(range(len(docs)), top_k)  # retrieval order: random
        name, code = facts[picked[0]]
        out.append((f"What is the secret code of the {name} archive?", [docs[i] for i in picked], code))
    return out


def _llm(args, disk_dir: str | None, documents: bool):
    from inferplug import LLM
    from inferplug.profile import load_profile

    profile = load_profile(args.profile)
    profile.cache.rag_document_cache = documents
    if disk_dir:
        profile.cache.rag_disk_size, profile.cache.rag_disk_dir = "8GiB", disk_dir
    return LLM(profile=profile)


def _run(engine, request) -> tuple[float, list[int], int]:
    """TTFT, the greedy answer, and the prompt tokens computed (not from a cache)."""
    start, first, tokens, computed = time.perf_counter(), None, [], 0
    engine.add_request(request)
    while engine.has_unfinished():
        for event in engine.step():
            if first is None and event.token_ids:
                first = time.perf_counter() - start
            tokens += event.token_ids
            if event.usage is not None:
                computed = event.usage.prompt_tokens - event.usage.cached_tokens
    return first, tokens, computed


def _request(engine, question: str, docs: list[str], hinted: bool, max_tokens: int):
    from inferplug.rag import document_spans, rag_messages
    from inferplug.types import Request, SamplingParams

    messages = rag_messages(question, docs)
    spans = document_spans(engine.render_chat(messages, None), docs) if hinted else None
    return Request(messages=messages, params=SamplingParams(temperature=0.0, max_tokens=max_tokens), documents=spans,
                   cache_salt=None if hinted else uuid.uuid4().hex)


def phase(args) -> dict:
    from inferplug.types import Request, SamplingParams

    docs, facts = corpus(args.docs, args.seed)
    work = queries(docs, facts, args.queries, args.top_k, args.seed)
    llm = _llm(args, args.dir if args.phase != "none" else None, documents=args.phase != "none")
    engine, result = llm.engine, {"phase": args.phase}
    if args.phase == "precompute":
        start = time.perf_counter()
        llm.precompute_documents(docs)
        result["precompute_s"] = time.perf_counter() - start
    else:  # first-call costs (kernels, allocators) are not TTFT
        _run(engine, Request(prompt="Warm up, please.", params=SamplingParams(temperature=0.0, max_tokens=2),
                             cache_salt=uuid.uuid4().hex))
    before = engine.stats()
    runs = [_run(engine, _request(engine, q, d, args.phase != "none", args.max_tokens)) for q, d, _ in work]
    result["ttft_s"] = [t for t, _, _ in runs]
    result["answers"] = [tokens for _, tokens, _ in runs]
    result["computed_tokens"] = [n for _, _, n in runs]
    result["facts"] = [code in llm.get_tokenizer().decode(tokens) for (_, _, code), (_, tokens, _) in zip(work, runs)]
    result["prompt_tokens"] = [len(engine.encode(_request(engine, q, d, False, 1))[0]) for q, d, _ in work]
    after = engine.stats()
    result["stats"] = {k: after[k] - before.get(k, 0) if k.startswith("doc_cache_disk_l") else after[k]
                       for k in after if k.startswith("doc_cache")}
    return result


def _spawn(args, name: str) -> dict:
    cmd = [sys.executable, __file__, "--phase", name, "--dir", args.dir, "--profile", args.profile,
           "--queries", str(args.queries), "--docs", str(args.docs), "--top-k", str(args.top_k),
           "--max-tokens", str(args.max_tokens), "--seed", str(args.seed)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        sys.exit(f"phase {name} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def report(runs: dict[str, dict]) -> dict:
    none, disk, pre = runs["none"], runs["disk"], runs["precompute"]
    summary = {"prompt_tokens_median": statistics.median(none["prompt_tokens"]), "precompute_s": pre["precompute_s"],
               "disk_bytes": disk["stats"]["doc_cache_disk_bytes"], "disk_loads": disk["stats"]["doc_cache_disk_loads"],
               "disk_hit_rate": disk["stats"]["doc_cache_hit_rate"],
               "same_as_in_memory_reuse": sum(a == b for a, b in zip(disk["answers"], pre["answers"])),
               "same_as_full_recompute": sum(a == b for a, b in zip(disk["answers"], none["answers"])),
               "facts": {m: sum(runs[m]["facts"]) for m in ("none", "disk")}, "queries": len(none["answers"])}
    for mode in ("none", "disk"):
        t = runs[mode]["ttft_s"]
        summary[mode] = {"mean_ms": 1e3 * statistics.mean(t), "median_ms": 1e3 * statistics.median(t),
                         "computed_tokens_median": statistics.median(runs[mode]["computed_tokens"])}
    summary["speedup_mean"] = summary["none"]["mean_ms"] / summary["disk"]["mean_ms"]
    summary["speedup_median"] = summary["none"]["median_ms"] / summary["disk"]["median_ms"]
    print(f"{summary['queries']} queries, median prompt {summary['prompt_tokens_median']} tokens; precompute "
          f"{summary['precompute_s']:.1f} s, {summary['disk_bytes'] / 2**20:.1f} MiB on disk")
    print("| mode | mean TTFT | median TTFT | prompt tokens computed (median) | facts |\n|---|---|---|---|---|")
    for mode, label in (("none", "no cache"), ("disk", "from disk, fresh process")):
        s = summary[mode]
        print(f"| {label} | {s['mean_ms']:.0f} ms | {s['median_ms']:.0f} ms | {s['computed_tokens_median']} | "
              f"{summary['facts'][mode]} |")
    print(f"speedup: {summary['speedup_mean']:.2f}x mean, {summary['speedup_median']:.2f}x median; disk loads "
          f"{summary['disk_loads']} (hit rate {summary['disk_hit_rate']:.2f}); answers equal to in-memory reuse "
          f"{summary['same_as_in_memory_reuse']}/{summary['queries']}, to full recompute "
          f"{summary['same_as_full_recompute']}/{summary['queries']}")
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", default="smollm2-135m")
    p.add_argument("--queries", type=int, default=8)
    p.add_argument("--docs", type=int, default=16)
    p.add_argument("--top-k", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the summary and every phase's figures here")
    p.add_argument("--phase", choices=["precompute", "disk", "none"], help=argparse.SUPPRESS)
    p.add_argument("--dir", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.phase:
        print(json.dumps(phase(args)))
        return
    with tempfile.TemporaryDirectory(prefix="rag-disk-") as folder:
        args.dir = folder
        runs = {name: _spawn(args, name) for name in ("precompute", "disk", "none")}
    summary = report(runs)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
