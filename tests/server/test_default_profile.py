"""The server on the default profile (SmolLM2 on the native engine): the openai client's view of
n, top logprobs and prefix-cache usage, and 32 concurrent streaming clients of which 8 leave
midway: the others complete, and afterwards the engine runs nothing and every KV block is free."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

pytestmark = [pytest.mark.smollm2, pytest.mark.slow]

CLIENTS, LEAVERS, MAX_TOKENS = 32, 8, 24
LEAVER_MAX_TOKENS = 64  # tells a leaver apart in the engine; hold_leavers_until_aborted keeps them from finishing


@pytest.fixture(scope="module")
def default_server(smollm2_gguf):
    from inferplug.backends.registry import close_backend, get_backend
    from inferplug.profile import DEFAULT_PROFILE

    backend = get_backend(DEFAULT_PROFILE)
    yield backend
    close_backend(DEFAULT_PROFILE)


def test_chat_n_top_logprobs_and_cached_tokens(default_server, server_factory):
    import openai

    from inferplug.types import Request, SamplingParams

    backend = default_server
    client = openai.OpenAI(base_url=server_factory(backend).url, api_key="unused", max_retries=0)
    system = "You are a helpful assistant who answers questions about geography briefly. " * 6
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "What is the capital of France?"}]
    kw = dict(model=backend.model_name, messages=messages, temperature=0, max_tokens=12)
    first = client.chat.completions.create(**kw)
    direct = backend.generate_sync(Request(messages=messages, params=SamplingParams(temperature=0, max_tokens=12)))
    assert first.choices[0].message.content == "".join(e.text for e in direct)
    again = client.chat.completions.create(n=2, logprobs=True, top_logprobs=2, **kw)
    assert [c.message.content for c in again.choices] == [first.choices[0].message.content] * 2
    assert again.usage.prompt_tokens == first.usage.prompt_tokens
    assert again.usage.prompt_tokens_details.cached_tokens >= backend.plan.block_size  # the prefix cache hit
    for entry in again.choices[0].logprobs.content:
        assert len(entry.top_logprobs) == 2 and entry.logprob <= 0
        assert entry.token == entry.top_logprobs[0].token  # greedy picks the likeliest
    sampled = dict(kw, temperature=1.0, seed=5, n=3)
    first_sample = [c.message.content for c in client.chat.completions.create(**sampled).choices]
    assert [c.message.content for c in client.chat.completions.create(**sampled).choices] == first_sample


def test_greedy_chat_streamed_and_not_gives_the_same_text(default_server, server_factory):
    """Batch invariance through the server: the streamed answer, its non-streamed twin (a prefix-cache hit by
    then) and one sent alongside 7 other requests are the same text (a Chinese prompt, as a user reported)."""
    import openai

    backend = default_server
    url = server_factory(backend).url
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
    kw = dict(model=backend.model_name, messages=[{"role": "user", "content": "请用一句话介绍长城。"}],
              temperature=0, max_tokens=32)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(stream=True, **kw)
                       if chunk.choices)
    assert streamed and client.chat.completions.create(**kw).choices[0].message.content == streamed

    async def crowd():
        aclient = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)
        others = [dict(kw, messages=[{"role": "user", "content": f"Count to {n}."}], max_tokens=8 + n) for n in range(7)]
        replies = await asyncio.gather(*(aclient.chat.completions.create(**k) for k in [kw, *others]))
        return replies[0].choices[0].message.content

    assert asyncio.run(crowd()) == streamed


def wait_until_idle(backend, limit_s: float = 60.0) -> dict:
    """The backend's stats once nothing runs or waits (aborts land asynchronously)."""
    deadline = time.monotonic() + limit_s
    while True:
        stats = backend.stats()
        if (stats["running"] == 0 and stats["waiting"] == 0) or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


def hold_leavers_until_aborted(engine, monkeypatch, limit_s: float = 60.0) -> list[str]:
    """A leaver cannot finish before its client leaves: the engine does not step while a leaver is one
    token short of LEAVER_MAX_TOKENS (for up to limit_s), so every leaver ends by an abort of a running
    request. Returns the ids of the requests the engine aborted while they ran."""
    step, abort, aborted = engine.step_tokens, engine.abort, []
    deadline = time.monotonic() + limit_s

    def held_step():
        last = any(seq.num_output_tokens >= LEAVER_MAX_TOKENS - 1 for state in engine.requests.values()
                   if state.request.params.max_tokens == LEAVER_MAX_TOKENS for seq in state.seqs)
        return [] if last and time.monotonic() < deadline else step()

    def recorded_abort(request_id):
        events = abort(request_id)
        if any(e.finish_reason == "abort" for e in events):
            aborted.append(request_id)
        return events

    monkeypatch.setattr(engine, "step_tokens", held_step)  # AsyncEngine's loop calls these on the instance
    monkeypatch.setattr(engine, "abort", recorded_abort)
    return aborted


def test_32_streams_with_8_disconnects_free_every_block(default_server, server_factory, monkeypatch):
    import openai

    backend = default_server
    aborted = hold_leavers_until_aborted(backend.engine.engine, monkeypatch)
    server = server_factory(backend)
    client = openai.AsyncOpenAI(base_url=server.url, api_key="unused", max_retries=0)

    async def one(i: int) -> tuple[str, str | None, int]:
        stream = await client.chat.completions.create(
            model=backend.model_name, stream=True, max_tokens=LEAVER_MAX_TOKENS if i < LEAVERS else MAX_TOKENS,
            temperature=0.8, seed=i,
            messages=[{"role": "user", "content": f"Tell me fact number {i} about the sea."}],
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )
        text, finish, usage = "", None, 0
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage:
                usage = chunk.usage.completion_tokens
            if i < LEAVERS and len(text) > 5:
                await stream.close()  # the client goes away midway
                return "left", None, 0
        return text, finish, usage

    async def all_clients():
        try:
            return await asyncio.gather(*(one(i) for i in range(CLIENTS)))
        finally:
            await client.close()

    results = asyncio.run(all_clients())
    assert [r[0] for r in results[:LEAVERS]] == ["left"] * LEAVERS
    assert len(aborted) == LEAVERS  # each leaver was still running when its client left
    for text, finish, usage in results[LEAVERS:]:
        assert text and finish == "length" and usage == MAX_TOKENS
    stats = wait_until_idle(backend)
    assert stats["running"] == 0 and stats["waiting"] == 0
    assert stats["kv_blocks_used"] == 0
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
    metrics = httpx.get(server.url.removesuffix("/v1") + "/metrics").text
    assert 'inferplug_requests_total{endpoint="/v1/chat/completions",status="499"} 8.0' in metrics
