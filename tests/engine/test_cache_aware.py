"""Cache-aware admission (engine/cache_aware.py) on the real engine: a request whose documents are cached is
admitted before uncached ones queued ahead of it, and no request waits more than twice its FIFO wait."""

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


def _first_tokens_behind_a_stream(model_dir, schedule: str, queue: list[Request]) -> tuple[dict, dict]:
    """The queue arrives while a stream decodes, so every step carries 16 prefill tokens (the CPU's decode cap):
    waits in steps follow the prefill tokens ahead. Returns each request's first-token step (counted from the
    queue's arrival) and its prompt tokens computed."""
    engine = make_engine(model_dir, max_num_seqs=8, max_prefill_tokens_while_decoding=16, schedule=schedule)
    prompt = "Session stream.\n" + rag_prompt("What is in stream?", CACHED, system="Use the documents.")
    engine.add_request(Request(prompt=prompt, params=greedy(60), documents=document_spans(prompt, CACHED),
                               request_id="stream"))  # it stores the cached documents' KV, then decodes
    while not engine.step():
        pass
    for request in queue:
        engine.add_request(request)
    first, computed, step = {}, {}, 0
    while engine.has_unfinished():
        step += 1
        for event in engine.step():
            if event.token_ids and event.request_id not in first:
                first[event.request_id] = step
            if event.usage is not None:
                computed[event.request_id] = event.usage.prompt_tokens - event.usage.cached_tokens
    del first["stream"]
    return first, computed


def test_no_request_waits_more_than_twice_its_fifo_wait(tiny_llama_dir):
    """An uncached request with eight cheaper cached ones queued behind it. Its FIFO wait is its own prefill (106
    tokens, 7 steps); cache-aware may put cached requests before it while the prefill computed before its first
    token stays within twice that, in tokens and in steps. The rule this replaced allowed one step's budget (256
    tokens) to pass a request with little ahead of it: three cached requests here, and a first token at step 23."""
    def queue():
        return [_request("u", ["Green frogs croak by the pond."])] + [_request(f"c{i}", CACHED) for i in range(8)]

    fifo, fifo_computed = _first_tokens_behind_a_stream(tiny_llama_dir, "fifo", queue())
    ours, computed = _first_tokens_behind_a_stream(tiny_llama_dir, "cache_aware", queue())
    assert min(fifo, key=fifo.get) == "u"
    cached_cost, u_cost = computed["c0"], computed["u"]
    assert cached_cost < u_cost < 3 * cached_cost <= 256  # the old allowance let three pass: 3.3x u's FIFO wait
    passed = [rid for rid in ours if ours[rid] < ours["u"]]
    assert passed, "no cached request went first"
    assert sum(computed[rid] for rid in passed) + u_cost <= 2 * fifo_computed["u"]
    assert sum(computed[rid] for rid in passed) + cached_cost > u_cost  # one more would have overdrawn it
    assert ours["u"] <= 2 * fifo["u"]
    behind = sorted((rid for rid in ours if ours[rid] > ours["u"]), key=ours.get)
    assert behind == [f"c{i}" for i in range(8) if f"c{i}" not in passed]  # FIFO after it
