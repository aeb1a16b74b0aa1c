"""Issue 43's identity checks through the measurement itself: a continuation teacher-forced after a prompt
(LLMEngine.prompt_logprob_rows with `after`) scores as the whole sequence does, with the prompt's KV from the
prefix cache or from documents reused where they were computed; moved documents move the scores (the metric
discriminates), and recomputing every reused token brings them back bit for bit."""

from __future__ import annotations

import pytest
import torch

from inferplug.benchmark.rag_fidelity import answer_fidelity
from inferplug.rag import rag_prompt
from inferplug.rag.layout import document_spans
from inferplug.types import Request
from tests.engine.engine_helpers import greedy, make_engine, run_all, tokens_of

DOCS = ["The red fox lives in the northern forest and eats berries all summer long.",
        "Blue whales sing long songs that travel across the cold ocean for miles.",
        "Copper wires carry current between the two brass plates of the old battery."]
MOVED = [DOCS[2], DOCS[0], DOCS[1]]


def _kernel_engine(model_dir, **overrides):
    """fp16 weights on the C++ kernels: a row's arithmetic does not depend on its step (test_batch_invariance)."""
    engine = make_engine(model_dir, weight_format="fp16", **overrides)
    if not getattr(engine.runner.model.ops, "paged_kernel", False):
        pytest.skip("the CPU kernels cannot run here (no AVX2/FMA/F16C): the torch path is not batch-invariant")
    return engine


def _request(docs: list[str], session: str, hinted: bool = True, salt: str | None = None) -> Request:
    # a distinct first line per session keeps the block prefix cache out: only the document cache reuses KV
    prompt = f"Session {session}.\n" + rag_prompt("Who eats berries?", docs)
    return Request(prompt=prompt, params=greedy(6), documents=document_spans(prompt, docs) if hinted else None,
                   cache_salt=salt)


def _answer_rows(engine, request: Request) -> tuple[list[int], torch.Tensor]:
    """Generate the request's greedy answer, then score that answer after the same prompt (its KV cached)."""
    prompt = engine.encode(request)
    answer = tokens_of(run_all(engine, [request])[request.request_id])
    return answer, engine.prompt_logprob_rows(answer, after=prompt, cache_salt=request.cache_salt)


def test_a_continuation_after_a_cached_prompt_scores_as_the_whole_sequence(tiny_llama_dir):
    engine = _kernel_engine(tiny_llama_dir)
    request = _request(DOCS, "a", hinted=False, salt="full")
    prompt_ids = engine.encode(request).ids
    answer, rows = _answer_rows(engine, request)
    assert engine.stats()["prefix_hit_tokens"] > len(prompt_ids) // 2  # the scoring request took the cached prompt
    whole = _kernel_engine(tiny_llama_dir).prompt_logprob_rows(prompt_ids + answer)
    assert rows.shape == (len(answer), whole.shape[1])
    assert torch.equal(rows, whole[len(prompt_ids) - 1:])
    assert rows.argmax(dim=-1)[:-1].tolist() == answer[1:]  # greedy: each row's argmax is the next answer token


def test_documents_reused_where_they_were_computed_score_as_a_full_prefill(tiny_llama_dir):
    # no prefix cache: the same prompt's documents then come from the document cache, in their own context
    engine = _kernel_engine(tiny_llama_dir, enable_prefix_caching=False)
    run_all(engine, [_request(DOCS, "b", salt="rag")])  # stores the documents
    full_answer, full = _answer_rows(_kernel_engine(tiny_llama_dir), _request(DOCS, "b", hinted=False))
    reused = engine.prompt_logprob_rows(full_answer, after=engine.encode(_request(DOCS, "b", salt="rag")),
                                        cache_salt="rag")
    assert engine.stats()["doc_cache_injected"] == len(DOCS)  # the second request took all three from the cache
    assert answer_fidelity(full, reused, full_answer).kld.max().item() == 0.0


@pytest.mark.parametrize("policy", ["deviation", "chunk_heads"])
def test_moved_documents_move_the_scores_and_full_recompute_brings_them_back(tiny_llama_dir, policy):
    full_answer, full = _answer_rows(_kernel_engine(tiny_llama_dir), _request(MOVED, "c", hinted=False))
    kld = {}
    for fraction in (0.0, 1.0):
        engine = _kernel_engine(tiny_llama_dir, rag_recompute=policy, rag_recompute_fraction=fraction)
        run_all(engine, [_request(DOCS, "a", salt="rag")])
        rows = engine.prompt_logprob_rows(full_answer, after=engine.encode(_request(MOVED, "c", salt="rag")),
                                          cache_salt="rag")
        assert engine.stats()["doc_cache_injected"] == len(DOCS)
        kld[fraction] = answer_fidelity(full, rows, full_answer).kld
    assert kld[0.0].max().item() > 0.0  # reuse at new neighbours and positions is not a full prefill (a tiny
    # random model is near-uniform, so by little: bench/rag_quality.py measures a real one)
    assert kld[1.0].max().item() == 0.0
