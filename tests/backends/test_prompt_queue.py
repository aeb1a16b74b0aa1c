"""The prompt workers' queue (backends/async_engine.py): clients take turns, and each has one request being
prepared at a time; closing hands out what is left, then None."""

from __future__ import annotations

import threading

from inferplug.backends.async_engine import PromptQueue
from inferplug.types import Request


def request(rid: str, client: str | None) -> Request:
    return Request(prompt="x", request_id=rid, client=client)


def test_clients_take_turns_one_request_each_at_a_time():
    queue = PromptQueue()
    for rid, client in [("a1", "a"), ("a2", "a"), ("a3", "a"), ("b1", "b"), ("n1", None), ("b2", "b")]:
        queue.put(request(rid, client))
    first = [queue.take() for _ in range(3)]
    assert [r.request_id for r in first] == ["a1", "b1", "n1"]  # a's next waits for a1, however early it came
    taken: list[Request] = []
    waiter = threading.Thread(target=lambda: taken.append(queue.take()))
    waiter.start()
    waiter.join(timeout=0.2)
    assert waiter.is_alive() and not taken  # every client with work has a request being prepared
    queue.done(first[0])
    waiter.join(timeout=10)  # a bound for a hang
    assert [r.request_id for r in taken] == ["a2"]
    queue.done(first[1])
    assert queue.take().request_id == "b2"
    queue.close()  # closing: the rest, whoever is busy, then None
    assert [queue.take().request_id, queue.take()] == ["a3", None]


def test_requests_of_no_client_take_any_free_worker_and_an_aborted_one_is_dropped():
    """Library calls and the integrations name no client: they are not shared out, so a batch of them uses every
    worker; a request aborted while it waits leaves the queue (it would hold its prompt until its turn)."""
    queue = PromptQueue()
    waiting = [request(f"n{i}", None) for i in range(3)] + [request("a1", "a"), request("a2", "a")]
    for r in waiting:
        queue.put(r)
    # in turn with a, and n1 taken while n0 is still prepared
    assert [queue.take().request_id for _ in range(3)] == ["n0", "a1", "n1"]
    queue.discard(waiting[2])
    queue.discard(waiting[4])
    queue.close()
    assert queue.take() is None  # n2 and a2 are gone
