"""Cache-aware admission (engine/cache_aware.py) on the real engine: a request whose documents are cached is
admitted before uncached ones queued ahead of it, and no request is passed over by more than its allowance."""

from __future__ import annotations

from inferplug.rag import rag_prompt
from inferplug.rag.layout import document_spans
from inferplug.types import Request

from engine_helpers import greedy, make_engine, run_all, tokens_of

CACHED = ["The red fox lives in the northern forest and eats berries.",
          "Blue whales sing long songs that travel across the ocean."]
UNCACHED = [["Green frogs croak loudly by the pond after the summer rain.",
             "Old clocks tick in the hall of the quiet stone house."],
            ["Tall pines sway in the wind on the ridge above the lake.",
             "Small boats drift past the harbour wall at dawn each day."]]


def _request(session: str, docs: list[str]) -> Request:
    # a distinct first line per request keeps the block prefix cache out: only the document cache holds KV
    prompt = f"Session {session}.\n" + rag_prompt(f"What is in {session}?", docs, system="Use the documents.")
    return Request(prompt=prompt, params=greedy(2), documents=document_spans(prompt, docs), request_id=session)


def _admission_order(engine, requests: list[Request]) -> tuple[list[str], dict[str, list]]:
    """One request runs at a time (max_num_seqs=1), so the order of first tokens is the order of admission."""
    for request in requests:
        engine.add_request(request)
    order, events = [], {}
    while engine.has_unfinished():
        for event in engine.step():
            if event.token_ids and event.request_id not in order:
                order.append(event.request_id)
            events.setdefault(event.request_id, []).append(event)
    return order, events


def _warm_engine(model_dir, schedule: str):
    engine = make_engine(model_dir, max_num_seqs=1, schedule=schedule)
    run_all(engine, [_request("warm", CACHED)])  # the cached documents' KV is stored
    return engine


def test_a_request_with_cached_documents_goes_before_uncached_ones(tiny_llama_dir):
    queue = [_request("u1", UNCACHED[0]), _request("u2", UNCACHED[1]), _request("c", CACHED)]
    fifo_order, fifo_events = _admission_order(_warm_engine(tiny_llama_dir, "fifo"), queue)
    assert fifo_order == ["u1", "u2", "c"]
    engine = _warm_engine(tiny_llama_dir, "cache_aware")
    order, events = _admission_order(engine, [_request("u1", UNCACHED[0]), _request("u2", UNCACHED[1]),
                                              _request("c", CACHED)])
    assert order == ["c", "u1", "u2"]
    assert engine.stats()["admitted_out_of_order"] == 1
    assert events["c"][-1].usage.cached_tokens > 0
    for rid in order:  # the order changes when a request runs, never what it answers
        assert tokens_of(events[rid]) == tokens_of(fifo_events[rid])


def test_no_request_is_passed_over_by_more_than_its_allowance(tiny_llama_dir):
    """The uncached head's allowance is one step's budget (nothing was ahead of it): cached requests may pass it
    while their prefill fits in that, and not one more."""
    engine = _warm_engine(tiny_llama_dir, "cache_aware")
    cached = [_request(f"c{i}", CACHED) for i in range(8)]
    order, events = _admission_order(engine, [_request("u", UNCACHED[0]), *cached])
    passed = order[:order.index("u")]
    computed = {rid: events[rid][-1].usage.prompt_tokens - events[rid][-1].usage.cached_tokens for rid in order}
    assert passed, "no cached request went first"
    assert sum(computed[rid] for rid in passed) <= engine.scheduler.max_num_batched_tokens
    assert sum(computed[rid] for rid in passed) + computed[order[len(passed) + 1]] > \
        engine.scheduler.max_num_batched_tokens  # the next one would have overdrawn it
    assert order[len(passed) + 1:] == [r.request_id for r in cached if r.request_id not in passed]  # FIFO after
