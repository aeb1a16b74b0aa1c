"""A busy or broken engine, seen through the server on the native engine (the tiny random Llama): /metrics answers
while a step holds the engine, a client that leaves before its first token is aborted at once (its blocks back),
a request waits at most queue_timeout_s, at most max_waiting wait (429 with Retry-After), and when the engine's
step thread dies every request fails with a clear 503 and /health says so.

`frozen` holds the engine's lock, as one long step does: nothing is admitted or stepped until it is released."""

from __future__ import annotations

import contextlib
import threading
import time

import httpx

from inferplug.profile_server import ServerOptions
from tests.server.test_server_errors import metric

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4}


@contextlib.contextmanager
def frozen(backend):
    backend.engine._lock.acquire()
    try:
        yield
    finally:
        backend.engine._lock.release()


def until(condition, bound: float = 20.0, what: str = "") -> None:
    """Wait for condition() (a bound for a hang, not a timing)."""
    deadline = time.monotonic() + bound
    while not condition():
        assert time.monotonic() < deadline, f"not within {bound} s: {what}"
        time.sleep(0.05)


def settled(backend) -> dict:
    """The engine's stats once it holds no request and its queue is empty; its block accounting checked."""
    until(lambda: not (backend.engine.engine.requests or backend.engine._inbox or backend.engine._preparing),
          what="the engine settles")
    backend.engine.engine.blocks.check_invariants()
    return backend.stats()


def in_background(call):
    """Run call() in a thread; the returned dict gets its result (or its exception) as "out"."""
    box: dict = {}

    def run() -> None:
        try:
            box["out"] = call()
        except Exception as exc:  # noqa: BLE001 - the test looks at what came back
            box["out"] = exc

    box["thread"] = threading.Thread(target=run, daemon=True)
    box["thread"].start()
    return box


def test_metrics_answer_while_a_step_holds_the_engine(native, server_factory):
    server = server_factory(native)
    with frozen(native):
        reply = httpx.get(server.url.removesuffix("/v1") + "/metrics", timeout=10)
    assert reply.status_code == 200 and "inferplug_kv_cache_usage_ratio" in reply.text


def test_a_client_that_leaves_before_its_first_token_is_aborted_and_its_blocks_come_back(native, server_factory):
    server = server_factory(native)
    free = settled(native)["kv_blocks_free"]
    left_before = metric(server, "/v1/chat/completions", "499")
    with frozen(native):
        box = in_background(lambda: httpx.post(server.url + "/chat/completions", json=CHAT, timeout=1))
        box["thread"].join()
        assert isinstance(box["out"], httpx.TimeoutException)  # the client gave up and closed its connection
        # noticed and aborted while the engine is still busy: it never waits its turn to be prefilled for nobody
        until(lambda: metric(server, "/v1/chat/completions", "499") == left_before + 1, what="the abort")
        assert not native.engine._inbox
    assert settled(native)["kv_blocks_free"] == free
    assert httpx.post(server.url + "/chat/completions", json=CHAT, timeout=60).status_code == 200


def generation_tokens(server) -> float:
    text = httpx.get(server.url.removesuffix("/v1") + "/metrics").text
    return next(float(row.split()[-1]) for row in text.splitlines()
                if row.startswith("inferplug_generation_tokens_total"))


def test_a_stream_its_client_leaves_counts_the_tokens_the_engine_gave_it(native, server_factory, monkeypatch):
    """The engine spent them: inferplug_generation_tokens_total counts a left stream's tokens, as vLLM's does."""
    engine = native.engine.engine
    step = engine.step_tokens

    def slow_step(*args, **kwargs):  # 200 tokens then take seconds: the client leaves before the stream ends
        time.sleep(0.02)
        return step(*args, **kwargs)

    monkeypatch.setattr(engine, "step_tokens", slow_step)
    server = server_factory(native)
    before, left_before = generation_tokens(server), metric(server, "/v1/chat/completions", "499")
    # logprobs: a chunk for every token (random byte tokens seldom complete a character to send)
    body = {**CHAT, "max_tokens": 200, "stream": True, "ignore_eos": True, "logprobs": True}
    with httpx.stream("POST", server.url + "/chat/completions", json=body, timeout=60) as reply:
        chunks = 0
        for line in reply.iter_lines():
            chunks += line.startswith("data: {")
            if chunks == 6:  # the role's chunk, then five of a token each
                break
    until(lambda: metric(server, "/v1/chat/completions", "499") == left_before + 1, what="the abort")
    assert 5 <= generation_tokens(server) - before < 200
    settled(native)


def test_a_request_waits_at_most_the_queue_timeout(native, server_factory):
    server = server_factory(native, options=ServerOptions(queue_timeout_s=1))
    free = settled(native)["kv_blocks_free"]
    with frozen(native):
        reply = httpx.post(server.url + "/chat/completions", json=CHAT, timeout=30)
    assert reply.status_code == 503 and reply.json()["error"]["code"] == "queue_timeout_s"
    assert "[server] queue_timeout_s" in reply.json()["error"]["message"] and reply.headers["Retry-After"] == "1"
    assert settled(native)["kv_blocks_free"] == free


def test_past_max_waiting_a_request_gets_429_with_retry_after(native, server_factory):
    server = server_factory(native, options=ServerOptions(max_waiting=1))
    with frozen(native):
        first = in_background(lambda: httpx.post(server.url + "/chat/completions", json=CHAT, timeout=60))
        until(lambda: len(native.engine._inbox) == 1, what="the first request queues")
        second = httpx.post(server.url + "/chat/completions", json=CHAT, timeout=30)
        assert second.status_code == 429 and second.headers["Retry-After"] == "1"
        assert second.json()["error"]["code"] == "max_waiting" and "--max-waiting" in second.json()["error"]["message"]
    first["thread"].join(timeout=60)
    assert first["out"].status_code == 200  # the one in line was served
    assert httpx.post(server.url + "/chat/completions", json=CHAT, timeout=60).status_code == 200


class StepThreadKilled(BaseException):
    """What no step handler catches: the step thread itself ends."""


def test_when_the_step_thread_dies_requests_fail_clearly_and_health_says_unhealthy(tiny_llama_dir, tmp_path,
                                                                                 server_factory):
    from inferplug.backends.registry import close_backend, get_backend

    path = tmp_path / "doomed.toml"  # an engine of its own: this test kills it
    path.write_text(f'name = "doomed"\nbackend = "native"\ndtype = "float32"\n[model]\npath = "{tiny_llama_dir}"\n'
                    'served_name = "tiny"\n')
    backend = get_backend(str(path))
    try:
        server = server_factory(backend)
        base = server.url.removesuffix("/v1")
        assert httpx.get(base + "/health").json() == {"status": "ok"}

        def killed() -> list:
            raise StepThreadKilled

        with frozen(backend):
            pending = in_background(lambda: httpx.post(server.url + "/chat/completions", json=CHAT, timeout=60))
            until(lambda: len(backend.engine._inbox) == 1, what="the request queues")
            backend.engine.engine.step_tokens = killed  # what the step thread runs each step
        pending["thread"].join(timeout=60)
        assert pending["out"].status_code == 503 and "step thread stopped" in pending["out"].json()["error"]["message"]
        health = httpx.get(base + "/health")
        assert health.status_code == 503 and health.json()["status"] == "unhealthy"
        later = httpx.post(server.url + "/chat/completions", json=CHAT, timeout=10)
        assert later.status_code == 503 and "restart the server" in later.json()["error"]["message"]
        assert backend.stats()["kv_blocks_used"] == 0
    finally:
        close_backend(str(path))


def refused_then_other_served(native, chat, code: str) -> None:
    """With the engine frozen, client "busy"'s first request queues, its second gets 429 `code` and another client's
    still queues; once the engine runs, both queued requests are served."""
    with frozen(native):
        first = in_background(lambda: chat("busy"))
        until(lambda: len(native.engine._inbox) == 1, what="the first request queues")
        again = chat("busy")
        assert again.status_code == 429 and again.headers["Retry-After"] == "1"
        assert again.json()["error"]["code"] == code
        other = in_background(lambda: chat("other"))
        until(lambda: len(native.engine._inbox) == 2, what="the other client's request queues")
    for box in (first, other):
        box["thread"].join(timeout=60)
        assert box["out"].status_code == 200


def tenant_chat(server):
    return lambda tenant: httpx.post(server.url + "/chat/completions", json=CHAT, headers={"X-Tenant": tenant},
                                     timeout=60)


def test_one_clients_flood_leaves_room_for_another(native, server_factory):
    server = server_factory(native, options=ServerOptions(max_waiting=8, max_waiting_per_client=1,
                                                          tenant_header="X-Tenant"))
    refused_then_other_served(native, tenant_chat(server), "max_waiting_per_client")


def test_prompts_are_rendered_tokenized_and_compiled_while_a_step_holds_the_engine(native, server_factory):
    server = server_factory(native)
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nope"}}}
    with frozen(native):  # the prompt stage needs no engine: its errors come back while a step runs
        bad = httpx.post(server.url + "/chat/completions", json=CHAT | {"response_format": schema}, timeout=30)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "json_schema"
        good = in_background(lambda: httpx.post(server.url + "/chat/completions", json=CHAT, timeout=60))
        until(lambda: len(native.engine._inbox) == 1, what="the request is prepared")
        _, _, (ids, text, _) = native.engine._inbox[0]  # the request, its channel, its prompt's ids, text, spans
        rendered = native.apply_chat_template(CHAT["messages"])
        assert text == rendered and ids == native.tokenizer.encode(rendered, add_special_tokens=False)
    good["thread"].join(timeout=60)
    assert good["out"].status_code == 200 and good["out"].json()["usage"]["prompt_tokens"] == len(ids)


def test_past_max_in_flight_per_client_a_client_gets_429_while_another_is_served(native, server_factory):
    server = server_factory(native, options=ServerOptions(max_in_flight_per_client=1, tenant_header="X-Tenant"))
    chat = tenant_chat(server)
    refused_then_other_served(native, chat, "max_in_flight_per_client")
    assert chat("busy").status_code == 200  # the finished request gave its place back
    assert settled(native)["kv_blocks_used"] == 0
