"""bench/rag_quality.py's runs: the full recompute, the noise floor and every RAG cache policy on one QA set.

Each configuration is an engine of its own (LLM(profile).engine), one request at a time, greedy answers:
  full      the RAG prompt computed whole (canonical layout, no document hints, a salt per query): the reference.
            Its greedy answer is scored against gold (F1) and teacher-forced for its log-softmax rows.
  floor     the same full prefill along another numeric path the product ships (another prefill chunk size, or
            another prompt-row GEMM path): the KL any two equal computations differ by.
  POLICY@F  the corpus stored first (six chunks a request in the queries' layout, as an index precomputes them),
            then each query with its document hints: its own greedy answer (F1, the document cache's reused
            tokens) and the full answer teacher-forced under the reused KV (inferplug/benchmark/rag_fidelity.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from inferplug.benchmark.rag_fidelity import AnswerFidelity, answer_fidelity, f1_score
from inferplug.rag import rag_messages, rag_prompt
from inferplug.stages.prompt import EncodedPrompt
from inferplug.types import Request, SamplingParams

RAG_SALT = "rag-quality"


@dataclass
class QASet:
    chunks: list[str]
    questions: list[str]
    gold: list[str]
    retrieved: list[list[int]]


@dataclass
class Answer:
    ids: list[int]
    text: str
    cached_tokens: int
    prompt_tokens: int


@dataclass
class ConfigResult:
    """One configuration over the set: each query's answer, F1, and fidelity against the full recompute."""

    answers: list[Answer] = field(default_factory=list)
    f1: list[float] = field(default_factory=list)
    fidelity: list[AnswerFidelity] = field(default_factory=list)
    doc_hit_tokens: int = 0  # prompt tokens the document cache gave the queries (not the prefix cache's)


def make_engine(profile: Any, **changes: dict[str, Any]):
    """The native LLM for `profile` with its tables changed (profile.with_tables)."""
    from inferplug.llm import LLM
    from inferplug.profile import with_tables

    return LLM(with_tables(profile, **changes))


def rag_request(question: str, docs: list[str], chat: bool, salt: str, hinted: bool, max_tokens: int) -> Request:
    """The reuse layout (canonical document order): chat messages, or a completion prompt for a base model; with
    the documents as cache hints when `hinted`."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    prompt = dict(messages=rag_messages(question, docs)) if chat else dict(prompt=rag_prompt(question, docs))
    return Request(**prompt, params=params, documents=docs if hinted else None, cache_salt=salt)


def query_request(qa: QASet, q: int, chat: bool, salt: str, hinted: bool, max_tokens: int) -> Request:
    return rag_request(qa.questions[q], [qa.chunks[c] for c in qa.retrieved[q]], chat, salt, hinted, max_tokens)


def generate(engine, request: Request) -> tuple[EncodedPrompt, Answer]:
    """Run one request alone; its encoded prompt and greedy answer."""
    prompt = engine.encode(request)
    engine.add_request(request, prompt)
    ids, text, usage = [], "", None
    while engine.has_unfinished():
        for event in engine.step():
            if event.error:
                raise RuntimeError(f"query {request.request_id} failed: {event.error}")
            ids += event.token_ids
            text += event.text
            usage = event.usage or usage
    return prompt, Answer(ids, text, usage.cached_tokens if usage else 0, len(prompt.ids))


def run_full(llm, qa: QASet, chat: bool, max_tokens: int, progress) -> tuple[ConfigResult, list[torch.Tensor]]:
    """The reference: each query's full prefill, its greedy answer and that answer's teacher-forced rows."""
    out, rows = ConfigResult(), []
    for q in progress(range(len(qa.questions)), "full recompute"):
        salt = f"full-{q}"  # its own prefix-cache namespace: nothing shared with another query
        prompt, answer = generate(llm.engine, query_request(qa, q, chat, salt, False, max_tokens))
        out.answers.append(answer)
        out.f1.append(f1_score(answer.text, qa.gold[q]))
        rows.append(llm.engine.prompt_logprob_rows(answer.ids, after=prompt, cache_salt=salt))
    return out, rows


def run_floor(llm, qa: QASet, chat: bool, full: ConfigResult, full_rows: list[torch.Tensor], queries: int,
              progress) -> ConfigResult:
    """The full answer teacher-forced after a full prefill along this engine's path (the first `queries`)."""
    out = ConfigResult()
    for q in progress(range(queries), "noise floor"):
        prompt = llm.engine.encode(query_request(qa, q, chat, f"floor-{q}", False, 1))
        rows = llm.engine.prompt_logprob_rows(full.answers[q].ids, after=prompt, cache_salt=f"floor-{q}")
        out.fidelity.append(answer_fidelity(full_rows[q], rows, full.answers[q].ids))
    return out


def run_policy(llm, qa: QASet, chat: bool, full: ConfigResult, full_rows: list[torch.Tensor], max_tokens: int,
               label: str, progress) -> ConfigResult:
    """The corpus precomputed, then each query with document hints: its answer and the full answer's fidelity."""
    for i in range(0, len(qa.chunks), 6):
        generate(llm.engine, rag_request("warm up", qa.chunks[i:i + 6], chat, RAG_SALT, True, 1))
    out = ConfigResult()
    for q in progress(range(len(qa.questions)), label):
        before = llm.engine.stats()["doc_cache_hit_tokens"]
        prompt, answer = generate(llm.engine, query_request(qa, q, chat, RAG_SALT, True, max_tokens))
        out.doc_hit_tokens += llm.engine.stats()["doc_cache_hit_tokens"] - before
        out.answers.append(answer)
        out.f1.append(f1_score(answer.text, qa.gold[q]))
        rows = llm.engine.prompt_logprob_rows(full.answers[q].ids, after=prompt, cache_salt=RAG_SALT)
        out.fidelity.append(answer_fidelity(full_rows[q], rows, full.answers[q].ids))
    return out
