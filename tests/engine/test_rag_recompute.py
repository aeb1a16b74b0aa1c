"""Selective recompute of reused RAG documents (engine/rag_recompute.py): at fraction 1 a blended prefill is a full
prefill bit for bit on the kernel path, at fraction 0 it is plain reuse, the recomputed tokens are counted, it runs
on the torch and Triton ops sets too, and the pool gets every block back after cancels and preemptions."""

from __future__ import annotations

import math

import pytest

from inferplug.engine.rag_recompute import RecomputePolicy, runs
from inferplug.rag import rag_prompt
from inferplug.rag.layout import document_spans
from inferplug.types import Request
from tests.engine.engine_helpers import greedy, make_engine, run_all, tokens_and_logprobs

DOCS = ["The red fox lives in the northern forest and eats berries all summer long.",
        "Blue whales sing long songs that travel across the cold ocean for miles.",
        "Copper wires carry current between the two brass plates of the old battery."]
POLICIES = ("deviation", "chunk_heads")


def _request(question: str, docs: list[str], session: str, rid: str, **params) -> Request:
    # a distinct first line per session keeps the block prefix cache out: only the document cache reuses KV
    prompt = f"Session {session}.\n" + rag_prompt(question, docs)
    return Request(prompt=prompt, params=greedy(8, logprobs=2, **params), documents=document_spans(prompt, docs),
                   request_id=rid)


def _kernel_engine(model_dir, **overrides):
    """fp16 weights on the C++ kernels: every row's arithmetic is the same whatever its step (test_batch_invariance)."""
    engine = make_engine(model_dir, weight_format="fp16", **overrides)
    if not getattr(engine.runner.model.ops, "paged_kernel", False):
        pytest.skip("the CPU kernels cannot run here (no AVX2/FMA/F16C): the torch path is not batch-invariant")
    return engine


def _blended(engine, moved: list[str]):
    """Store DOCS, then a request reusing them in another order after a new first line: its events."""
    run_all(engine, [_request("q1", DOCS, "a", "first")])
    return run_all(engine, [_request("Who eats berries?", moved, "b", "blended")])


MOVED = [DOCS[2], DOCS[0], DOCS[1]]


@pytest.mark.parametrize("policy", POLICIES)
def test_recomputing_every_token_is_a_full_prefill_bit_for_bit(tiny_llama_dir, policy):
    # 32-token steps: a document's ~75 recomputed tokens exceed one, so they run over the budget in a step of their own
    engine = _kernel_engine(tiny_llama_dir, rag_recompute=policy, rag_recompute_fraction=1.0, max_num_batched_tokens=32)
    blended = _blended(engine, MOVED)
    stats = engine.stats()
    assert stats["doc_cache_injected"] == len(DOCS)
    assert stats["doc_cache_recomputed_tokens"] == stats["doc_cache_hit_tokens"]  # every reused token, once
    full = run_all(_kernel_engine(tiny_llama_dir, rag_document_cache=False),
                   [_request("Who eats berries?", MOVED, "b", "blended")])
    assert tokens_and_logprobs(blended) == tokens_and_logprobs(full)


@pytest.mark.parametrize("policy", POLICIES)
def test_fraction_zero_is_plain_reuse(tiny_llama_dir, policy):
    reused = _blended(_kernel_engine(tiny_llama_dir), MOVED)
    engine = _kernel_engine(tiny_llama_dir, rag_recompute=policy, rag_recompute_fraction=0.0)
    assert tokens_and_logprobs(_blended(engine, MOVED)) == tokens_and_logprobs(reused)
    assert engine.stats()["doc_cache_recomputed_tokens"] == 0


@pytest.mark.parametrize("policy", POLICIES)
def test_a_fraction_of_each_reused_segment_is_recomputed_and_counted(tiny_llama_dir, policy):
    engine = _kernel_engine(tiny_llama_dir, rag_recompute=policy, rag_recompute_fraction=0.3)
    reused_events = _blended(_kernel_engine(tiny_llama_dir), MOVED)
    blended_events = _blended(engine, MOVED)
    # the blended request reused every stored document: a rounded-up 30% of each one's tokens
    expected = sum(math.ceil(0.3 * entry.k.shape[1]) for entry in engine.doc_cache.entries.values())
    assert engine.stats()["doc_cache_recomputed_tokens"] == expected
    assert tokens_and_logprobs(blended_events) != tokens_and_logprobs(reused_events)  # the recomputed rows changed
    # the reused KV the answer reads; they were computed, so usage does not count them as cached
    cached = [events["blended"][-1].usage.cached_tokens for events in (reused_events, blended_events)]
    assert cached[1] == cached[0] - expected > 0


@pytest.mark.parametrize("attention", ["torch", "triton"])
def test_full_recompute_answers_as_a_full_prefill_on_other_ops_sets(tiny_llama_dir, attention):
    def engine(**overrides):
        return make_engine(tiny_llama_dir, attention=attention, **overrides)

    def tokens(events):
        return {rid: [t for e in ev for t in e.token_ids] for rid, ev in events.items()}

    full = run_all(engine(rag_document_cache=False), [_request("Who eats berries?", MOVED, "b", "blended")])
    for policy in POLICIES:
        blended = _blended(engine(rag_recompute=policy, rag_recompute_fraction=1.0), MOVED)
        assert tokens(blended)["blended"] == tokens(full)["blended"], policy


@pytest.mark.parametrize("policy", POLICIES)
def test_every_block_comes_back_after_a_cancel_at_any_step_of_a_blended_prefill(tiny_llama_dir, policy):
    engine = _kernel_engine(tiny_llama_dir, rag_recompute=policy, rag_recompute_fraction=0.3,
                            max_num_batched_tokens=48)
    run_all(engine, [_request("q1", DOCS, "a", "first")])
    for cancel_after in range(12):
        engine.add_request(_request("Who eats berries?", MOVED, f"b{cancel_after}", "blended"))
        for _ in range(cancel_after):
            engine.step()
        engine.abort("blended")
        engine.blocks.check_invariants()
        assert engine.blocks.num_free == engine.blocks.num_blocks
    assert engine.stats()["doc_cache_recomputed_tokens"] > 0  # some cancels came after a recompute step


@pytest.mark.parametrize("policy", POLICIES)
def test_blended_prefills_under_preemption_keep_the_pool_exact(tiny_llama_dir, policy):
    # 40 blocks of 16 tokens cannot hold four ~300-token prompts (byte-level tokens) at once: some are preempted mid-prefill
    engine = _kernel_engine(tiny_llama_dir, rag_recompute=policy, rag_recompute_fraction=0.3, num_kv_blocks=40,
                            max_num_batched_tokens=64, max_num_seqs=4)
    run_all(engine, [_request("q1", DOCS, "a", "first")])
    orders = [MOVED, DOCS[::-1], [DOCS[1], DOCS[2], DOCS[0]], DOCS]
    events = run_all(engine, [_request(f"q{i}", docs, f"s{i}", f"r{i}") for i, docs in enumerate(orders)])
    assert engine.stats()["preemptions"] > 0
    assert all(ev[-1].finish_reason == "length" for ev in events.values())


def test_policy_values_are_checked():
    with pytest.raises(ValueError, match="rag_recompute_fraction"):
        RecomputePolicy("deviation", 1.5)
    with pytest.raises(ValueError, match="one of"):
        RecomputePolicy("blend", 0.1)
    assert RecomputePolicy("chunk_heads", 0.15).for_segment(10, 30).end == 13  # ceil(0.15 * 20) = 3 first tokens
    assert runs([3, 4, 5, 9, 11, 12]) == [(3, 6), (9, 10), (11, 13)]
