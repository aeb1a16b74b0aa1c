"""Soak: 1,000 requests from 64 clients at once against the served app on loopback, on a KV pool small enough to
force preemption. A fifth of them leave at a random point, one in twenty is bad input; the rest mix streaming,
n=2, stop strings, tool calls and JSON schemas. Afterwards every good answer is valid, every bad one got a 4xx,
the server still answers, and every KV block and every thread is back."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time

import httpx
import pytest

pytestmark = pytest.mark.slow

REQUESTS, CLIENTS, CANCEL_SHARE, BAD_SHARE = 1000, 64, 0.20, 0.05
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string", "enum": ["Paris", "Rome"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"]}}}
POOLS = ("AnyIO worker thread", ("asyncio_", "uvloop"))  # AnyIO's pool; the loop's default executor (either loop)
BAD = [  # (body changes, the status they must get)
    ({"temperature": 7}, 400), ({"model": "nope"}, 404), ({"messages": []}, 400), ({"max_tokens": 0}, 400),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, 400),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nope"}}}}, 400),
]


@pytest.fixture(scope="module")
def small_pool_server(tiny_llama_dir, tmp_path_factory):
    from inferplug.backends.registry import close_backend, get_backend
    from tests.server.conftest import start_server

    path = tmp_path_factory.mktemp("soak") / "soak.toml"
    path.write_text(f'name = "soak"\nbackend = "native"\ndtype = "float32"\n[model]\npath = "{tiny_llama_dir}"\n'
                    'served_name = "tiny"\n[cache]\nmemory = "0.25MiB"\n')  # 64 blocks of 16 fp16 tokens: ~3 tool prompts
    backend = get_backend(str(path))
    server = start_server(backend)
    yield server
    server.stop()
    close_backend(str(path))


def good_request(rng: random.Random) -> tuple[str, dict]:
    ask = [{"role": "user", "content": rng.choice(["Paris?", "Tell me a story.", "Hi", "What is 2+2?"])}]
    base = {"model": "tiny", "messages": ask, "max_tokens": rng.randint(4, 32), "temperature": rng.choice([0, 0.8]),
            "seed": rng.randint(0, 99)}
    kind = rng.choice(["stream", "n2", "stop", "tools", "json"])
    extra = {"stream": {"stream": True, "stream_options": {"include_usage": True}},
             "n2": {"n": 2},
             "stop": {"stop": ["e", "a "], "stream": rng.random() < 0.5},
             "tools": {"tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": False,
                       "max_tokens": 120, "temperature": 0, "stream": rng.random() < 0.5},
             "json": {"response_format": {"type": "json_schema", "json_schema": {
                 "name": "w", "schema": WEATHER["function"]["parameters"]}}, "max_tokens": 120, "temperature": 0}}
    return kind, base | extra[kind]


async def send(client: httpx.AsyncClient, body: dict, leave_after: int | None) -> tuple[int, list[dict], float | None]:
    """(status, the JSON objects received, seconds to the first one). `leave_after`: disconnect after that many
    streamed chunks (0: before any), or for a whole response abandon it while it is being generated."""
    start = time.perf_counter()
    async with client.stream("POST", "/chat/completions", json=body) as response:
        if response.status_code != 200:
            return response.status_code, [json.loads(await response.aread())], None
        if not body.get("stream"):
            if leave_after is not None:
                return 499, [], None  # closing the stream now is the client leaving mid-generation
            return 200, [json.loads(await response.aread())], time.perf_counter() - start
        chunks, first = [], None
        async for line in response.aiter_lines():
            if leave_after is not None and len(chunks) >= leave_after:
                return 499, chunks, first
            if line.startswith("data: ") and line != "data: [DONE]":
                first = first or time.perf_counter() - start
                chunks.append(json.loads(line[6:]))
        return 200, chunks, first


def check_good(kind: str, body: dict, chunks: list[dict]) -> None:
    """Valid output for the request's kind: choices, finish reasons, stop strings, tool calls, JSON."""
    if body.get("stream"):
        texts, finishes, calls = {}, {}, {}
        for chunk in chunks:
            for c in chunk["choices"]:
                texts[c["index"]] = texts.get(c["index"], "") + (c["delta"].get("content") or "")
                finishes[c["index"]] = c["finish_reason"] or finishes.get(c["index"])
                for call in c["delta"].get("tool_calls") or []:  # a call's pieces: its name, then its arguments
                    joined = calls.setdefault(call["index"], {"name": "", "arguments": ""})
                    for key in joined:
                        joined[key] += call["function"].get(key) or ""
        assert chunks[-1].get("usage") or not body.get("stream_options")
        choices = [{"text": texts[i], "finish": finishes[i], "calls": list(calls.values())} for i in sorted(texts)]
    else:
        choices = [{"text": c["message"]["content"], "finish": c["finish_reason"],
                    "calls": [t["function"] for t in c["message"].get("tool_calls") or []]}
                   for c in chunks[0]["choices"]]
    assert len(choices) == body.get("n", 1)
    for choice in choices:
        assert choice["finish"] in ({"tool_calls", "length"} if kind == "tools" else {"stop", "length"}), choice
        if kind == "stop":
            assert not any(s in choice["text"] for s in body["stop"])
        if kind == "tools" and choice["finish"] == "tool_calls":
            assert [c["name"] for c in choice["calls"]] == ["weather"]
            args = json.loads(choice["calls"][0]["arguments"])
            assert args["city"] in ("Paris", "Rome") and 1 <= args["days"] <= 7
        if kind == "json" and choice["finish"] == "stop":
            value = json.loads(choice["text"])
            assert value["city"] in ("Paris", "Rome") and 1 <= value["days"] <= 7


async def soak(url: str) -> dict:
    rng = random.Random(15)
    plan = []
    for _ in range(REQUESTS):
        if rng.random() < BAD_SHARE:
            change, status = rng.choice(BAD)
            plan.append(("bad", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]} | change, status))
            continue
        kind, body = good_request(rng)
        leave = rng.randint(0, 6) if rng.random() < CANCEL_SHARE else None
        plan.append((kind, body, leave))
    queue: asyncio.Queue = asyncio.Queue()
    for item in plan:
        queue.put_nowait(item)
    outcome = {"good": 0, "bad": 0, "left": 0, "ttft": []}

    async def client_loop(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            kind, body, third = queue.get_nowait()
            status, chunks, first = await send(client, body, None if kind == "bad" else third)
            if kind == "bad":
                assert status == third, (body, status, chunks)
                outcome["bad"] += 1
            elif third is not None:
                outcome["left"] += 1
            else:
                assert status == 200, (body, chunks)
                check_good(kind, body, chunks)
                outcome["good"] += 1
                if first is not None and body.get("stream"):
                    outcome["ttft"].append(first)

    started = time.perf_counter()
    limits = httpx.Limits(max_connections=CLIENTS)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(CLIENTS)))
    outcome["seconds"] = time.perf_counter() - started
    return outcome


def test_1000_requests_64_clients_cancels_bad_input_and_preemption_lose_nothing(small_pool_server):
    backend = small_pool_server.backend
    threads_before = set(threading.enumerate())
    preemptions_before = backend.stats()["preemptions"]
    outcome = asyncio.run(soak(small_pool_server.url))
    while backend.stats()["running"] or backend.stats()["waiting"]:  # aborts of the last leavers land
        time.sleep(0.05)
    stats = backend.stats()
    ttft = sorted(outcome["ttft"])
    p99 = ttft[int(0.99 * (len(ttft) - 1))]
    print(f"\nsoak: {REQUESTS} requests in {outcome['seconds']:.1f} s = {REQUESTS / outcome['seconds']:.1f} req/s; "
          f"{outcome['good']} good, {outcome['left']} left, {outcome['bad']} bad; p99 TTFT (streamed) {p99:.3f} s; "
          f"{stats['preemptions'] - preemptions_before} preemptions; kv_blocks_used after {stats['kv_blocks_used']} "
          f"of {stats['kv_blocks_total']}")
    assert outcome["good"] + outcome["left"] + outcome["bad"] == REQUESTS
    assert stats["preemptions"] > preemptions_before  # the pool was small enough to matter
    assert stats["kv_blocks_used"] == 0
    backend.engine.engine.blocks.check_invariants()
    reply = httpx.post(small_pool_server.url + "/chat/completions", timeout=60, json={
        "model": "tiny", "messages": [{"role": "user", "content": "still there?"}], "max_tokens": 3})
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] is not None
    # no request left a thread behind: beyond the threads there before, only the bounded worker pools the server
    # borrows (AnyIO's, 40 at most; its loop's default executor, asyncio's or uvloop's, min(32, cpus + 4)) may have
    # grown (threads of other event loops in this process, from earlier tests, are not the server's)
    new = set(threading.enumerate()) - threads_before
    assert not [t for t in new if not t.name.startswith((POOLS[0], *POOLS[1]))], new
    assert sum(t.name.startswith(POOLS[0]) for t in new) <= 40
    assert sum(t.name.startswith(POOLS[1]) for t in new) <= 32
