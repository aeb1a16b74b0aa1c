"""The RAG workload for `inferplug bench --dataset-name rag`.

The corpus, BM25 retrieval and Zipf-popular queries are the integrations' own
(`make_workload` in inferplug/benchmark/rag_workload.py, shared with bench/rag_cache.py); prompts use
inferplug.rag's reuse-friendly layout and carry document spans as cache hints, so the
benchmark measures what a RAG app on inferplug actually sends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from inferplug.benchmark.datasets import BenchRequest
from inferplug.benchmark.rag_workload import make_workload
from inferplug.rag import document_spans, rag_messages, rag_prompt


def rag_requests(
    num_prompts: int,
    output_len: int,
    tokenizer: Any = None,
    seed: int = 0,
    render_chat: Callable[[list[dict[str, str]]], str] | None = None,
) -> list[BenchRequest]:
    """One request per query: system text, its top-4 chunks in canonical order, the question.

    With `render_chat` (a chat template) the prompt is the rendered chat; without one it is
    inferplug.rag's plain-text layout for completion models.
    """
    workload = make_workload(num_queries=num_prompts, seed=seed)
    requests = []
    for question, chunk_ids in zip(workload.queries, workload.retrieved):
        docs = [workload.chunks[i] for i in chunk_ids]
        text = render_chat(rag_messages(question, docs)) if render_chat else rag_prompt(question, docs)
        length = len(tokenizer.encode(text, add_special_tokens=False)) if tokenizer is not None else len(text) // 4
        requests.append(BenchRequest(text, length, output_len, documents=document_spans(text, docs)))
    return requests
