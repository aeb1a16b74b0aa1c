"""Admission shared out between clients (issue 29, "no unbounded queue-jumping"): one client's flood of n = 8
requests, whose siblings and preempted sequences queue first, cannot hold another client's request back for more
than one freed seat. Real engine on the tiny Llama; the bound is counted in engine steps, not time."""

from __future__ import annotations

from inferplug.types import Request
from tests.engine.engine_helpers import greedy, make_engine, run_all, tokens_of

MAX_TOKENS = 16  # each flood sequence frees its seat within this many steps of decoding


def first_token_step(engine, request_id: str, limit: int) -> int:
    """Steps until request_id's first token (AssertionError past `limit`: starved)."""
    for step in range(1, limit + 1):
        if any(e.request_id == request_id and e.token_ids for e in engine.step()):
            return step
    raise AssertionError(f"no first token in {limit} steps")


def test_a_flood_of_n8_requests_cannot_starve_another_clients_request(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir, max_num_seqs=4, num_kv_blocks=256)
    flood = [Request(prompt=[5 + i, 6, 7, 8], params=greedy(MAX_TOKENS, n=8), client="flood") for i in range(12)]
    for request in flood:
        engine.add_request(request)
    for _ in range(3):  # the flood fills every seat, its siblings queue ahead of anyone arriving now
        engine.step()
    lone = Request(prompt=[40, 41, 42], params=greedy(4), client="lone")
    engine.add_request(lone)
    # first-come order would put it behind 12 x 8 sequences of 16 tokens on 4 seats (~380 steps)
    assert first_token_step(engine, lone.request_id, limit=MAX_TOKENS + 4) <= MAX_TOKENS + 4
    for request in flood:
        engine.abort(request.request_id)
    events = run_all(engine, [])
    alone = run_all(make_engine(tiny_llama_dir, max_num_seqs=4), [Request(prompt=[40, 41, 42], params=greedy(4))])
    assert len(tokens_of(events[lone.request_id])) == 3  # the rest of its 4 tokens, after the first
    assert tokens_of(alone[next(iter(alone))])[1:] == tokens_of(events[lone.request_id])


def test_one_client_keeps_first_come_order(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir, max_num_seqs=2)
    requests = [Request(prompt=[5 + i, 6, 7], params=greedy(4)) for i in range(5)]
    firsts: list[str] = []
    for request in requests:
        engine.add_request(request)
    while engine.has_unfinished():
        for event in engine.step():
            if event.token_ids and event.request_id not in firsts:
                firsts.append(event.request_id)
    assert firsts == [r.request_id for r in requests]
