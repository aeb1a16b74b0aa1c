"""One RAG request per cache mode, run and summarized: the steps bench/rag_cache.py and its paper-shaped modes
(rag_paper_runs.py, bench/rag_paper_7b.py) share.

Modes: "none" salts every request apart, "prefix" sends what a plain RAG app sends (chunks in retrieval order),
"rag" the inferplug.rag layout with document hints, "recompute" that layout salted apart without hints.
"""

from __future__ import annotations

import statistics
import time
import uuid

from inferplug.rag import DEFAULT_SYSTEM, document_spans, rag_messages
from inferplug.types import Request, SamplingParams


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
