"""Cache-aware admission (engine/cache_aware.py) on the real engine: a request whose documents are cached is
admitted before uncached ones queued ahead of it, and no request waits more than twice its FIFO wait."""

from __future__ import annotations

import pytest

from inferplug.rag import rag_prompt
from inferplug.rag.layout import document_spans
from inferplug.types import Request
from tests.engine.engine_helpers import greedy, make_engine, run_all, tokens_of


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


def _first_tokens(engine, requests: list[Request]) -> tuple[dict[str, int], dict[str, list]]:
    """Add the requests at once and step until done: each one's first-token step (from their arrival) and events."""
    for request in requests:
        engine.add_request(request)
    first, events, step = {}, {}, 0
    while engine.has_unfinished():
        step += 1
        for event in engine.step():
            if event.token_ids:
                first.setdefault(event.request_id, step)
            events.setdefault(event.request_id, []).append(event)
    return first, events


def test_a_request_with_cached_documents_goes_before_uncached_ones(tiny_llama_dir):
    """A seat for each request and steps of 32 tokens, no cap: c, whose documents are cached, goes before u1 and u2
    (about 170 tokens each, uncached), and neither waits more than twice its FIFO wait. With one seat (as this test
    had) c took the seat u1 would have had, and u1's first token came at step 5 against FIFO's 1: a request now
    moves only while a seat is left for each request it passes."""
    def queue():
        return [_request("u1", UNCACHED[0]), _request("u2", UNCACHED[1]), _request("c", CACHED)]

    runs = {}
    for schedule in ("fifo", "cache_aware"):
        engine = make_engine(tiny_llama_dir, max_num_seqs=3, max_num_batched_tokens=32, schedule=schedule)
        run_all(engine, [_request("warm", CACHED)])  # the cached documents' KV is stored
        runs[schedule] = _first_tokens(engine, queue())
    (fifo, fifo_events), (ours, events) = runs["fifo"], runs["cache_aware"]
    assert sorted(fifo, key=fifo.get) == ["u1", "u2", "c"]
    assert sorted(ours, key=ours.get) == ["c", "u1", "u2"]
    assert engine.stats()["admitted_out_of_order"] == 1
    assert events["c"][-1].usage.cached_tokens > 0
    assert all(ours[rid] <= 2 * fifo[rid] for rid in ours)
    for rid in ours:  # the order changes when a request runs, never what it answers
        assert tokens_of(events[rid]) == tokens_of(fifo_events[rid])


def _first_tokens_behind_a_stream(model_dir, schedule: str, **limits) -> tuple[dict, dict]:
    """An uncached request u with eight cheaper cached ones queued behind it, arriving while a stream decodes.
    Returns each request's first-token step (counted from the queue's arrival) and its prompt tokens computed."""
    engine = make_engine(model_dir, max_num_seqs=10, schedule=schedule, **limits)
    prompt = "Session stream.\n" + rag_prompt("What is in stream?", CACHED, system="Use the documents.")
    engine.add_request(Request(prompt=prompt, params=greedy(60), documents=document_spans(prompt, CACHED),
                               request_id="stream"))  # it stores the cached documents' KV, then decodes
    while not engine.step():
        pass
    queue = [_request("u", ["Green frogs croak by the pond."])] + [_request(f"c{i}", CACHED) for i in range(8)]
    first, events = _first_tokens(engine, queue)
    del first["stream"]
    return first, {rid: ev[-1].usage.prompt_tokens - ev[-1].usage.cached_tokens for rid, ev in events.items()}


def test_under_the_cpus_decode_cap_no_request_is_passed(tiny_llama_dir):
    """Steps of 256 tokens, 16 of prefill while a stream decodes (the CPU's defaults). u's FIFO wait is its own
    prefill (106 tokens, 7 steps). The rule this replaced let one step's budget pass it: three cached requests,
    whose decodes held u's prefill to 16 tokens a step, and its first token at step 23 (3.3x). A request moved
    first holds every step to the cap, so no allowance keeps 2x against a FIFO that runs at 256: none is given."""
    limits = {"max_num_batched_tokens": 256, "max_prefill_tokens_while_decoding": 16}
    fifo, fifo_computed = _first_tokens_behind_a_stream(tiny_llama_dir, "fifo", **limits)
    ours, computed = _first_tokens_behind_a_stream(tiny_llama_dir, "cache_aware", **limits)
    assert computed["c0"] < computed["u"] < 3 * computed["c0"] <= 256  # cached ones, cheaper: the old rule's case
    assert min(fifo, key=fifo.get) == min(ours, key=ours.get) == "u"
    assert ours == fifo


def test_without_a_cap_no_request_waits_more_than_twice_its_fifo_wait(tiny_llama_dir):
    """Steps of 32 tokens, no decode cap: a cached request goes before u while what it is charged (its prefill
    and its one decode row, greedy(2)) stays within u's allowance, its FIFO wait of 106 tokens, and u's wait in
    steps within twice FIFO's. Charging every seat's decode row instead (a step's prefill floor B - (max_num_seqs -
    1) = 23) left an allowance of 46, below one cached request's 84. In steps of 96 or 128 one is moved first, but
    its first token comes after u's: its prompt takes a step for each stretch between its cached documents, u's 106
    tokens only two; so the steps here are short enough for u's prefill to outlast that."""
    limits = {"max_num_batched_tokens": 32, "max_prefill_tokens_while_decoding": 0}
    fifo, fifo_computed = _first_tokens_behind_a_stream(tiny_llama_dir, "fifo", **limits)
    ours, computed = _first_tokens_behind_a_stream(tiny_llama_dir, "cache_aware", **limits)
    assert min(fifo, key=fifo.get) == "u"
    passed = [rid for rid in ours if ours[rid] < ours["u"]]
    assert passed, "no cached request went first"
    charged = sum(computed[rid] + 1 for rid in passed)  # prefill and one decode row each
    assert charged <= fifo_computed["u"] < charged + computed["c0"] + 1  # one more would overdraw u's allowance
    assert ours["u"] <= 2 * fifo["u"]
    behind = sorted((rid for rid in ours if ours[rid] > ours["u"]), key=ours.get)
    assert behind == [f"c{i}" for i in range(8) if f"c{i}" not in passed]  # FIFO after it


# 256 tokens (16 blocks): a request that continues it computes only its own few tokens
SHARED = "Shared notes: " + " ".join(f"item {i} is kept on shelf {i % 7}." for i in range(9)) + " " + "-" * 8


def _u_ahead_of_cached_requests(model_dir, seats: int, cached: int, streams: int = 0) -> tuple[dict, dict]:
    """32-token steps, no cap, `seats` seats: u, uncached (100 tokens), then `cached` requests that share the cached
    SHARED and compute 4-5 tokens each, queued while `streams` requests already decode. Each request's first-token
    step (from the queue's arrival) under FIFO and under cache_aware; u is FIFO's first and some cached request
    cache_aware's."""
    limits = {"max_num_batched_tokens": 32, "max_prefill_tokens_while_decoding": 0, "max_num_seqs": seats,
              "num_kv_blocks": 1024}
    first = {}
    for schedule in ("fifo", "cache_aware"):
        engine = make_engine(model_dir, schedule=schedule, **limits)
        run_all(engine, [Request(prompt=SHARED + " warm", params=greedy(1), request_id="warm")])  # caches SHARED
        for i in range(streams):
            engine.add_request(Request(prompt=f"Stream {i} goes on.", params=greedy(120), request_id=f"s{i}"))
        while engine.scheduler.waiting or not all(s.num_output_tokens for s in engine.scheduler.running):
            engine.step()  # every stream decodes before the queue comes
        queue = [Request(prompt="Unshared: " + "x" * 90, params=greedy(2), request_id="u")] + [
            Request(prompt=SHARED + f" c{i}?", params=greedy(40), request_id=f"c{i}") for i in range(cached)]
        first[schedule] = {rid: step for rid, step in _first_tokens(engine, queue)[0].items() if rid[0] != "s"}
    fifo, ours = first["fifo"], first["cache_aware"]
    assert min(fifo, key=fifo.get) == "u"
    assert min(ours, key=ours.get) != "u", "no cached request went first"
    return fifo, ours


@pytest.mark.parametrize("seats, cached", [(17, 16), (32, 31), (9, 16)])
def test_with_many_seats_no_request_waits_more_than_twice_its_fifo_wait(tiny_llama_dir, seats, cached):
    """A review's case: a request moved first decodes a row every step from its first token on, taken from the
    budget before u's next chunk: while only their prefill was charged, 16 of them (17 seats) held u to 16 prefill
    tokens a step and 22 (32 seats) to 10, and u's first token came at steps 9 and 15 against FIFO's 4. With more of
    them than seats (9 seats, 16 of them), those moved first took every seat and u waited for one to end, to step
    46, before a seat was kept for each request passed."""
    fifo, ours = _u_ahead_of_cached_requests(tiny_llama_dir, seats, cached)
    assert {rid: ours[rid] for rid in ours if ours[rid] > 2 * fifo[rid]} == {}


@pytest.mark.parametrize("streams", [8, 16])
def test_with_streams_already_decoding_no_request_waits_more_than_twice_its_fifo_wait(tiny_llama_dir, streams):
    """As above with 64 seats and 9 cached requests, while `streams` requests already decode (a review's case): their
    rows take budget every step under both orders and are not in u's FIFO wait, so u's bound in steps is counted on
    what a step has left for prefill. Counted on the whole 32 tokens, the 9 cached requests moved first were charged
    too few decode rows: u's first token came at step 18 against FIFO's 7 with 16 streams (9 against 5 with 8); now
    at 11 and 8."""
    fifo, ours = _u_ahead_of_cached_requests(tiny_llama_dir, 64, 9, streams)
    assert {rid: ours[rid] for rid in ours if ours[rid] > 2 * fifo[rid]} == {}
