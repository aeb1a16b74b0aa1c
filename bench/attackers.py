"""Hostile clients against `inferplug serve` (issue 29, "Measured"): does one well-behaved stream keep its TPOT while
three attackers loop over the requests that issue lists?

The server runs the default profile on loopback with four API keys, one per client: a client is an API key (the
server shares its seats out by client). One good stream (the official openai client, greedy, `ignore_eos`) measures
its TPOT alone, then while the attackers run, twice over in the same run (the host is noisy). Each attacker cycles
through the hostile requests below; what the server answered each is counted.

    python bench/attackers.py [--profile smollm2-135m] [--streams 5] [--max-tokens 128] [--rounds 2] [--mix all]
                              [--server-cpus 0 --attacker-cpus 1]

On a small host the attackers' own Python work takes the server's cores; --server-cpus / --attacker-cpus keep them
apart, as attackers on other machines are (the "alone" phase then runs on the server's cores only too).
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import os
import socket
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import openai

from inferplug.server.launch import start_serve

GOOD_KEY, ATTACKER_KEYS = "good-key", ("attacker-1", "attacker-2", "attacker-3")
MODEL = "smollm2-135m"
Hostile = Callable[[str, str], str]  # (base url, key) -> what happened, as a short label


def _post(base: str, key: str, path: str, body: dict | bytes, timeout: float = 120) -> str:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    try:
        return str(httpx.post(base + path, content=content, headers=headers, timeout=timeout).status_code)
    except httpx.HTTPError as exc:
        return type(exc).__name__


def _chat(content: str, **extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 16, **extra}


# --- the hostile requests (issue 29, "Found") ------------------------------------------------------------------
_PROMPT_BATCH = (b'{"model": "' + MODEL.encode() + b'", "n": 128, "max_tokens": 16, "prompt": ['
                 + b"[1]," * 2_000_000 + b"[1]]}")  # ~8 MiB of one-token prompts
# ~7 MiB of text, over the context (encoded once: the attackers' own JSON work must not slow the measuring client)
_BIG_PROMPT = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "lighthouse keeper " * 400_000}],
                          "max_tokens": 16}).encode()
# ~50 KB: under max_schema_bytes, so it is compiled
_SCHEMA = {"type": "object", "properties": {f"field_{i}": {"type": "string", "maxLength": 8} for i in range(1000)}}
_INT_ARG = {"type": "object", "properties": {"a": {"type": "integer"}}}
_TOOLS = [{"type": "function", "function": {"name": f"tool_{i}", "description": "x " * 40, "parameters": _INT_ARG}}
          for i in range(20)]
_HISTORY_CALL = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
    "name": "tool_1", "arguments": '{"a":1' + " " * 50_000}}]}  # a malformed call, whitespace-padded
_held: list[tuple[float, socket.socket]] = []  # sockets left open on purpose, closed by _reap
_held_lock = threading.Lock()


def prompt_batch(base: str, key: str) -> str:
    return _post(base, key, "/v1/completions", _PROMPT_BATCH)


def n_128(base: str, key: str) -> str:
    return _post(base, key, "/v1/chat/completions", _chat("hi", n=128))


def n_times_max_tokens(base: str, key: str) -> str:
    return _post(base, key, "/v1/chat/completions", _chat("hi", n=16, max_tokens=16_000))


def huge_prompt(base: str, key: str) -> str:
    return _post(base, key, "/v1/chat/completions", _BIG_PROMPT)


def many_messages(base: str, key: str) -> str:
    return _post(base, key, "/v1/chat/completions", {"model": MODEL, "max_tokens": 4,
                                                     "messages": [{"role": "user", "content": "m"}] * 20_000})


def large_schema(base: str, key: str) -> str:
    fmt = {"type": "json_schema", "json_schema": {"name": "big", "schema": _SCHEMA}}
    return _post(base, key, "/v1/chat/completions", _chat("fill the form", response_format=fmt))


def tools_and_whitespace_history(base: str, key: str) -> str:
    messages = [{"role": "user", "content": "call a tool"}, _HISTORY_CALL,
                {"role": "tool", "tool_call_id": "c1", "content": " " * 20_000},
                {"role": "user", "content": 'answer with <tool_call>{"a":1 and then only spaces'}]
    return _post(base, key, "/v1/chat/completions", {"model": MODEL, "messages": messages, "tools": _TOOLS,
                                                     "max_tokens": 64})


def tool_call_whitespace(base: str, key: str) -> str:
    """Tools offered, and the model asked to drift into a tool call padded with whitespace (parsed as it ends)."""
    return _post(base, key, "/v1/chat/completions", _chat('write <tool_call>{"a":1 then 200 spaces', tools=_TOOLS,
                                                          max_tokens=128, ignore_eos=True))


def long_stop_strings(base: str, key: str) -> str:
    """As many stop strings, as long, as the limits allow, checked on each of 64 tokens."""
    return _post(base, key, "/v1/chat/completions", _chat("go on", stop=[c * 256 for c in "abcdefghijklmnop"],
                                                          max_tokens=64, ignore_eos=True))


def many_stop_strings(base: str, key: str) -> str:
    return _post(base, key, "/v1/chat/completions", _chat("go on", stop=["x"] * 5000))


def slow_loris(base: str, key: str) -> str:
    """Four connections that send a head and one body byte, then nothing (the server cuts them off with 408)."""
    for _ in range(4):
        _hold(_open(base, key, "/v1/completions", b"", declared=1000, first=b"{"))
    return "held"


def stops_reading(base: str, key: str) -> str:
    """A long stream that is never read."""
    body = json.dumps(_chat("tell a long story", max_tokens=256, stream=True, ignore_eos=True)).encode()
    _hold(_open(base, key, "/v1/chat/completions", body))
    return "held"


def leaves_before_first_token(base: str, key: str) -> str:
    body = json.dumps(_chat("lighthouse " * 1500, max_tokens=64)).encode()
    _open(base, key, "/v1/chat/completions", body).close()
    return "left"


def scrapes_metrics(base: str, key: str) -> str:
    return str(httpx.get(base + "/metrics", headers={"Authorization": f"Bearer {key}"}, timeout=60).status_code)


def benign(base: str, key: str) -> str:
    """Not an attack: a well-behaved client's streamed answer, read to its end. Three of them are the baseline for
    what sharing the engine's batch costs the good stream."""
    body = _chat("tell a long story", max_tokens=64, stream=True, ignore_eos=True)
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, headers=headers, timeout=120) as reply:
        for _ in reply.iter_bytes():
            pass
    return str(reply.status_code)


# what a limit refuses, a timeout cuts off or a disconnect aborts: none of it should cost the good stream much
REFUSED: list[Hostile] = [prompt_batch, n_128, n_times_max_tokens, huge_prompt, many_messages, many_stop_strings,
                          slow_loris, leaves_before_first_token, scrapes_metrics]
# what the limits allow (a compiled 50 KB schema, tools, a history whose malformed call is read as text, long stop
# strings, a stream nobody reads, which generates until its socket buffers fill): generation, and prefills of long
# prompts, that share the engine's batch with the good stream
ALLOWED: list[Hostile] = [large_schema, tool_call_whitespace, tools_and_whitespace_history, long_stop_strings,
                          stops_reading]
MIXES = {"refused": REFUSED, "all": REFUSED + ALLOWED, "benign": [benign],
         **{h.__name__: [h] for h in REFUSED + ALLOWED}}  # one alone: what it costs


def _open(base: str, key: str, path: str, body: bytes, declared: int | None = None,
          first: bytes = b"") -> socket.socket:
    host, port = base.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=30)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a reader that stops fills its buffer soon
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {declared or len(body)}\r\n\r\n")
    s.sendall(head.encode() + (first or body))
    return s


def _hold(s: socket.socket, seconds: float = 45) -> None:
    with _held_lock:
        _held.append((time.monotonic() + seconds, s))


def _reap(everything: bool = False) -> None:
    with _held_lock:
        now, kept = time.monotonic(), []
        for until, s in _held:
            if everything or until <= now:
                s.close()
            else:
                kept.append((until, s))
        _held[:] = kept


def attack(base: str, key: str, offset: int, stop: Any, mix: str, results: Any, cpus: set[int] | None) -> None:
    """One attacker process (its own GIL: the measuring client must not wait on the attackers' Python work), on
    `cpus` when given (as remote attackers would be: their own work off the server's cores)."""
    if cpus:
        os.sched_setaffinity(0, cpus)
    seen: collections.Counter = collections.Counter()
    i = offset
    while not stop.is_set():
        hostile = MIXES[mix][i % len(MIXES[mix])]
        try:
            seen[(hostile.__name__, hostile(base, key))] += 1
        except OSError as exc:
            seen[(hostile.__name__, type(exc).__name__)] += 1
        _reap()
        i += 1
    _reap(everything=True)
    results.put(dict(seen))


# --- the well-behaved stream ------------------------------------------------------------------------------------
def good_tpot(base: str, max_tokens: int) -> float:
    """One greedy stream's TPOT in ms: (last token - first token) / (tokens - 1), tokens from its usage."""
    client = openai.OpenAI(base_url=base + "/v1", api_key=GOOD_KEY, max_retries=0, timeout=600)
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Tell me a story about a lighthouse keeper."}],
        max_tokens=max_tokens, temperature=0, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True})
    first = last = None
    tokens = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content is not None:
            last = time.perf_counter()
            first = first or last
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return (last - first) / (tokens - 1) * 1000


def phase(base: str, streams: int, max_tokens: int, mix: str | None,
          cpus: set[int] | None = None) -> tuple[float, collections.Counter]:
    """The median TPOT of `streams` good streams, one after another; with a `mix`, while three attackers run it."""
    ctx = multiprocessing.get_context("spawn")
    stop, results, seen = ctx.Event(), ctx.Queue(), collections.Counter()
    attackers = [ctx.Process(target=attack, args=(base, key, 4 * i, stop, mix, results, cpus), daemon=True)
                 for i, key in enumerate(ATTACKER_KEYS)] if mix else []
    for p in attackers:
        p.start()
    if mix:
        time.sleep(10)  # the attack under way (the processes started) before the measurement starts
    started = time.monotonic()
    tpots = [good_tpot(base, max_tokens) for _ in range(streams)]
    print(f"{mix or 'alone'}: TPOTs {', '.join(f'{t:.1f}' for t in tpots)} ms in {time.monotonic() - started:.0f} s",
          flush=True)
    stop.set()
    for _ in attackers:
        seen.update(results.get(timeout=300))
    for p in attackers:
        p.join(timeout=60)
    return statistics.median(tpots), seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default=MODEL)
    parser.add_argument("--streams", type=int, default=5, help="good streams per phase (median TPOT)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2, help="alone-then-attacked rounds")
    parser.add_argument("--mix", choices=sorted(MIXES), default="all",
                        help="refused: what a limit refuses or a timeout cuts off; all: also what the limits allow; "
                             "benign: three well-behaved streams, the baseline for all; a hostile request's name: "
                             "that one alone")
    parser.add_argument("--max-in-flight-per-client", type=int, help="the server's limit (default: the profile's)")
    parser.add_argument("--server-cpus", help="CPUs of the server and the measuring client, e.g. 0 (default: all)")
    parser.add_argument("--attacker-cpus", help="CPUs of the attackers, e.g. 1: off the server's, as remote ones are")
    args = parser.parse_args()
    server_cpus, attacker_cpus = (set(map(int, c.split(","))) if c else None for c in (args.server_cpus,
                                                                                          args.attacker_cpus))
    if server_cpus:  # the server inherits it, and the threads it starts
        os.sched_setaffinity(0, server_cpus)
    limit = ["--max-in-flight-per-client", str(args.max_in_flight_per_client)] if args.max_in_flight_per_client else []
    keys = ",".join((GOOD_KEY, *ATTACKER_KEYS))
    proc, base = start_serve(args.profile, "--api-key", keys, "--log-level", "error", *limit)
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # drain its output
    try:
        good_tpot(base, 8)  # warm-up: kernels, caches
        rows, outcomes = [], collections.Counter()
        for r in range(args.rounds):
            alone, _ = phase(base, args.streams, args.max_tokens, None)
            attacked, seen = phase(base, args.streams, args.max_tokens, args.mix, attacker_cpus)
            rows.append((r + 1, alone, attacked))
            outcomes.update(seen)
        health = httpx.get(base + "/health", timeout=30).status_code
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    print(f"\nmix {args.mix}, max_in_flight_per_client {args.max_in_flight_per_client or 'default'}, "
          f"{args.streams} streams of {args.max_tokens} tokens per phase (median TPOT), server CPUs "
          f"{args.server_cpus or 'all'}, attacker CPUs {args.attacker_cpus or 'all'}")
    print("| round | TPOT alone (ms) | TPOT attacked (ms) | ratio |\n|---|---|---|---|")
    for r, alone, attacked in rows:
        print(f"| {r} | {alone:.1f} | {attacked:.1f} | {attacked / alone:.2f}x |")
    print(f"\n/health after the attacks: {health}")
    print("\n| hostile request | server's answers (count) |\n|---|---|")
    for hostile in MIXES[args.mix]:
        answers = {a: n for (name, a), n in sorted(outcomes.items()) if name == hostile.__name__}
        print(f"| {hostile.__name__} | {', '.join(f'{a} x{n}' for a, n in answers.items())} |")


if __name__ == "__main__":
    main()
