"""The RAG workload for `inferplug bench --dataset-name rag`.

The corpus, BM25 retrieval and Zipf-popular queries are the integrations' own
(`make_workload` in bench/rag_workload.py, shared with bench/rag_cache.py); prompts use
inferplug.rag's reuse-friendly layout and carry document spans as cache hints, so the
benchmark measures what a RAG app on inferplug actually sends.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from inferplug.benchmark.datasets import BenchRequest
from inferplug.errors import InferPlugError
from inferplug.rag import document_spans, rag_messages, rag_prompt

WORKLOAD_FILE = Path(__file__).resolve().parents[2] / "bench" / "rag_workload.py"


def _workload_module() -> ModuleType:
    """bench/rag_workload.py of this source checkout (the benchmark scripts are not installed)."""
    spec = importlib.util.spec_from_file_location("inferplug_rag_workload", WORKLOAD_FILE)
    if spec is None or not WORKLOAD_FILE.is_file():
        raise InferPlugError(
            f"the RAG workload needs {WORKLOAD_FILE}, which ships with the source checkout: "
            "run `inferplug bench` from a clone installed with `pip install -e .`"
        )
    if spec.name not in sys.modules:  # dataclasses look their module up there
        sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules[spec.name]


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
    workload = _workload_module().make_workload(num_queries=num_prompts, seed=seed)
    requests = []
    for question, chunk_ids in zip(workload.queries, workload.retrieved):
        docs = [workload.chunks[i] for i in chunk_ids]
        text = render_chat(rag_messages(question, docs)) if render_chat else rag_prompt(question, docs)
        length = len(tokenizer.encode(text, add_special_tokens=False)) if tokenizer is not None else len(text) // 4
        requests.append(BenchRequest(text, length, output_len, documents=document_spans(text, docs)))
    return requests
