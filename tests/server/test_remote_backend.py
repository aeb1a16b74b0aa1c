"""The remote OpenAI backend against `inferplug serve` on loopback, and against a flaky proxy
in front of it (scripted 503/429 answers and a stream cut midway) for retries."""

from __future__ import annotations

import json

import httpx
import pytest
from fastapi import FastAPI, Request as HTTPRequest
from fastapi.responses import JSONResponse, StreamingResponse

from inferplug.backends.openai import OpenAIBackend
from inferplug.errors import BackendUnavailable, RequestError
from inferplug.profile import ModelSource, OpenAIOptions, Profile
from inferplug.types import Request, SamplingParams

MESSAGES = [{"role": "user", "content": "hello there"}]
GREEDY = dict(temperature=0, max_tokens=10, ignore_eos=True)


def remote(plan_for_openai, url: str, context_length: int | None = None, **options) -> OpenAIBackend:
    profile = Profile(name="remote", backend="openai", model=ModelSource(context_length=context_length),
                      openai=OpenAIOptions(base_url=url, **options))
    return OpenAIBackend(profile, plan_for_openai(profile))


@pytest.fixture(scope="module")
def plan_for_openai():
    from inferplug.hardware import probe
    from inferplug.resolver import resolve

    hardware = probe()
    return lambda profile: resolve(profile, hardware)


def text_of(events, index=0) -> str:
    return "".join(e.text for e in events if e.index == index)


def test_chat_and_completion_match_the_served_backend(live_server, plan_for_openai):
    backend = remote(plan_for_openai, live_server.url)
    for request in (dict(messages=MESSAGES), dict(prompt="the weather is")):
        got = backend.generate_sync(Request(params=SamplingParams(**GREEDY), **request))
        want = live_server.backend.generate_sync(Request(params=SamplingParams(**GREEDY), **request))
        assert backend.model_name == "tiny-llama" and backend.context_length == live_server.backend.context_length
        assert text_of(got) == text_of(want)
        assert got[-1].finish_reason == "length" and got[-1].usage.completion_tokens == 10
        assert got[-1].usage.prompt_tokens == want[-1].usage.prompt_tokens
        assert [e for e in got if e.usage is not None] == [got[-1]]


def test_n_stop_and_logprobs(live_server, plan_for_openai):
    backend = remote(plan_for_openai, live_server.url)
    full = text_of(backend.generate_sync(Request(prompt="the weather is", params=SamplingParams(**GREEDY))))
    stop = full[3:5]
    events = backend.generate_sync(Request(prompt="the weather is", params=SamplingParams(
        **GREEDY, n=2, stop=[stop], logprobs=0)))
    for index in (0, 1):
        assert text_of(events, index) == full[: full.index(stop)]
    finishes = [e for e in events if e.finish_reason]
    assert sorted(e.index for e in finishes) == [0, 1] and events[-1].finish_reason == "stop"
    assert all(lp.logprob <= 0 for e in events for lp in e.logprobs or [])


def test_logit_bias_is_passed_on(server_factory, native, plan_for_openai):
    backend = remote(plan_for_openai, server_factory(native).url)
    biased = SamplingParams(**GREEDY, logit_bias={t: -100.0 for t in range(0, len(native.tokenizer), 2)})
    got = text_of(backend.generate_sync(Request(prompt="the weather is", params=biased)))
    assert got == text_of(native.generate_sync(Request(prompt="the weather is", params=biased)))
    assert got != text_of(native.generate_sync(Request(prompt="the weather is", params=SamplingParams(**GREEDY))))


def test_request_errors_come_back_as_request_errors(live_server, plan_for_openai):
    backend = remote(plan_for_openai, live_server.url)
    with pytest.raises(RequestError, match="temperature"):
        backend.generate_sync(Request(prompt="hi", params=SamplingParams(temperature=9)))
    with pytest.raises(RequestError, match="context") as info:
        backend.generate_sync(Request(prompt=[5] * (live_server.backend.context_length + 1)))
    assert info.value.status == 400 and info.value.param == "prompt"


def test_api_key_from_the_named_env_var_and_never_in_errors(server_factory, tiny_backend, plan_for_openai,
                                                           monkeypatch):
    server = server_factory(tiny_backend, api_key="k-123-secret")
    monkeypatch.setenv("REMOTE_API_KEY", "k-123-secret")
    good = remote(plan_for_openai, server.url, api_key_env="REMOTE_API_KEY")
    assert good.generate_sync(Request(messages=MESSAGES, params=SamplingParams(max_tokens=2)))[-1].usage
    monkeypatch.setenv("REMOTE_API_KEY", "k-999-wrong")
    with pytest.raises(BackendUnavailable) as info:  # the model list is read with the first request
        remote(plan_for_openai, server.url, api_key_env="REMOTE_API_KEY").generate_sync(Request(messages=MESSAGES))
    assert "k-999" not in str(info.value) and "REMOTE_API_KEY" in str(info.value)
    wrong = remote(plan_for_openai, server.url, 512, api_key_env="REMOTE_API_KEY", model="tiny-llama")
    with pytest.raises(RequestError) as info:
        wrong.generate_sync(Request(messages=MESSAGES))
    assert info.value.status == 401 and "k-999" not in str(info.value)


def flaky_proxy(target: str, failures: list[int], cut_after_chunks: int | None = None) -> FastAPI:
    """Forwards to `target`, but first answers with the statuses in `failures`, one per request;
    with `cut_after_chunks`, drops the connection after that many streamed lines. It keeps the bodies it was
    sent (app.state.bodies) and the lines it relayed (app.state.lines)."""
    app = FastAPI()
    app.state.posts, app.state.bodies, app.state.lines = 0, [], []

    @app.get("/v1/models")
    async def models():
        return httpx.get(target + "/models").json()

    @app.post("/v1/{path:path}")
    async def forward(path: str, request: HTTPRequest):
        app.state.posts += 1
        if failures:
            status = failures.pop(0)
            return JSONResponse({"error": {"message": "try later"}}, status_code=status,
                                headers={"retry-after": "0"})
        body = await request.body()
        app.state.bodies.append(json.loads(body))

        async def relay():
            async with httpx.AsyncClient() as client:
                async with client.stream("POST", f"{target}/{path}", content=body,
                                         headers={"content-type": "application/json"}) as upstream:
                    sent = 0
                    async for line in upstream.aiter_lines():
                        if cut_after_chunks is not None and line.startswith("data:") and sent == cut_after_chunks:
                            raise ConnectionResetError("proxy cut the stream")
                        sent += line.startswith("data:")
                        app.state.lines.append(line)
                        yield line + "\n"

        return StreamingResponse(relay(), media_type="text/event-stream")

    return app


def test_retries_on_5xx_and_429_before_the_first_token(live_server, server_factory, plan_for_openai):
    app = flaky_proxy(live_server.url, failures=[503, 429])
    proxy = server_factory(app)
    backend = remote(plan_for_openai, proxy.url, max_retries=2)
    events = backend.generate_sync(Request(messages=MESSAGES, params=SamplingParams(**GREEDY)))
    assert events[-1].finish_reason == "length" and app.state.posts == 3

    app = flaky_proxy(live_server.url, failures=[502, 502])
    backend = remote(plan_for_openai, server_factory(app).url, max_retries=1)
    with pytest.raises(BackendUnavailable, match="502"):
        backend.generate_sync(Request(messages=MESSAGES))
    assert app.state.posts == 2


def test_no_retry_after_tokens_were_streamed(live_server, server_factory, plan_for_openai):
    app = flaky_proxy(live_server.url, failures=[], cut_after_chunks=3)
    backend = remote(plan_for_openai, server_factory(app).url, max_retries=3)
    events = backend.generate_sync(Request(messages=MESSAGES, params=SamplingParams(**GREEDY)))
    assert text_of(events) and events[-1].finish_reason == "error" and events[-1].error
    assert app.state.posts == 1


def test_unreachable_server_is_a_clear_error(plan_for_openai):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once the socket closes
    url = f"http://127.0.0.1:{port}/v1"
    with pytest.raises(BackendUnavailable, match="cannot reach"):
        remote(plan_for_openai, url).generate_sync(Request(prompt="hi"))
    backend = remote(plan_for_openai, url, 512, model="m", max_retries=1)
    with pytest.raises(BackendUnavailable, match="after 2 tries"):
        backend.generate_sync(Request(prompt="hi"))
