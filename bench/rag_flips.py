"""Where reused document KV changes SmolLM2's greedy answer (issue 28's quality rule): for each question of the
paper-shaped workload, plain reuse against a full prefill of the same prompt, the first answer token that differs,
and both runs' top-3 log-probabilities there (a near-tie in the full run is what a small KV change flips).

    nice .venv/bin/python bench/rag_flips.py --queries 8
"""

from __future__ import annotations

import argparse

from inferplug.benchmark.rag_paper_workload import make_paper_workload
from inferplug.rag import document_spans, rag_messages
from inferplug.types import Request, SamplingParams


def _run(engine, messages, docs, salt: str, rid: str, max_tokens: int, hinted: bool = True) -> list:
    spans = document_spans(engine.render_chat(messages, None), docs) if hinted else None
    engine.add_request(Request(messages=messages, params=SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                                                        logprobs=3),
                               documents=spans, cache_salt=salt, request_id=rid))
    out = []
    while engine.has_unfinished():
        for event in engine.step():
            out += [(lp.token_id, lp.token, lp.top) for lp in (event.logprobs or [])]
    return out


def main() -> None:
    from inferplug.llm import LLM
    from inferplug.profile import load_profile

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="smollm2-135m")
    ap.add_argument("--queries", type=int, default=8)
    ap.add_argument("--entities", type=int, default=6)
    ap.add_argument("--answer-tokens", type=int, default=24)
    args = ap.parse_args()
    profile = load_profile(args.profile)
    engine = LLM(profile.model_copy(update={"cache": profile.cache.model_copy(update={"memory": "512MiB"})})).engine
    workload = make_paper_workload(args.queries, num_entities=args.entities)
    for i in range(0, len(workload.chunks), 6):  # every chunk stored once, six to a request
        docs = workload.chunks[i:i + 6]
        _run(engine, rag_messages("warm up", docs), docs, "rag", f"warm{i}", 1)
    for q, question in enumerate(workload.questions):
        docs = [workload.chunks[c] for c in workload.retrieved[q]]
        messages = rag_messages(question, docs)
        reused = _run(engine, messages, docs, "rag", f"reuse{q}", args.answer_tokens)
        full = _run(engine, messages, docs, f"full{q}", f"full{q}", args.answer_tokens, hinted=False)
        flip = next((i for i, (a, b) in enumerate(zip(full, reused)) if a[0] != b[0]), None)
        print(f"{q}: first flip at answer token {flip}")
        for name, run in (("full", full), ("reused", reused)):
            print(f"   {name:>6}: " + "".join(t for _, t, _ in run).replace("\n", " "))
            if flip is not None:
                print(f"           top-3 there: {[(t, round(lp, 3)) for _, t, lp in run[flip][2]]}")


if __name__ == "__main__":
    main()
