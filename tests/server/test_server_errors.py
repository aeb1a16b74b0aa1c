"""Failures the server must report in OpenAI's shape: backend exceptions (before and during a
stream, for every choice of an n > 1 request), bugs (a JSON 500 without internals) and aborts
(counted apart in the metrics). The tiny CTranslate2 backend runs; `Faulty` injects the failure."""

from __future__ import annotations

import json
import logging

import httpx
import openai
import pytest

from inferplug.server.app import create_app
from inferplug.server.generation import Generation
from inferplug.types import Event, Request, SamplingParams

MESSAGES = [{"role": "user", "content": "hello there"}]


class Faulty:
    """The tiny backend, with a failure injected after its first `after` events (0: before any):
    `exc` raised, or else the request aborted there (ended as the backends end an aborted choice;
    waiting for the real backend's abort would race the tiny model finishing first)."""

    def __init__(self, backend, exc: Exception | None, after: int):
        self.backend, self.exc, self.after = backend, exc, after

    def __getattr__(self, name):
        return getattr(self.backend, name)

    async def generate(self, request):
        stream = self.backend.generate(request)
        for _ in range(self.after):
            yield await anext(stream)
        await stream.aclose()
        if self.exc is not None:
            raise self.exc
        await self.backend.abort(request.request_id)
        for index in range(request.params.n):
            yield Event(request.request_id, index, finish_reason="abort")


def metric(server, endpoint: str, status: str) -> float:
    text = httpx.get(server.url.removesuffix("/v1") + "/metrics").text
    line = f'inferplug_requests_total{{endpoint="{endpoint}",status="{status}"}}'
    return next((float(row.split()[-1]) for row in text.splitlines() if row.startswith(line)), 0.0)


def test_a_backend_failure_finishes_every_choice_of_an_n_request(tiny_backend):
    backend = Faulty(tiny_backend, RuntimeError("device lost"), after=2)
    params = SamplingParams(n=3, temperature=1.0, seed=3, max_tokens=8, ignore_eos=True)

    async def run():
        generation = Generation(backend, [Request(prompt="one", params=params)])
        await generation.start()
        events = [e async for e in generation.events()]
        await generation.aclose()
        return events

    events = tiny_backend.run_sync(run())
    finished = {e.index: e for e in events if e.finish_reason}
    assert sorted(finished) == [0, 1, 2]
    assert all(e.finish_reason == "error" and e.error == "device lost" for e in finished.values())


def test_an_unexpected_exception_is_a_json_500_without_internals(server_factory, tiny_backend, caplog):
    server = server_factory(create_app(Faulty(tiny_backend, ValueError("secret internals"), after=0)))
    with caplog.at_level(logging.ERROR, logger="inferplug.server.app"):
        with pytest.raises(openai.InternalServerError) as info:
            server.client().chat.completions.create(model="tiny-llama", messages=MESSAGES, max_tokens=4)
    body = info.value.body
    assert body["message"] == "internal error: ValueError; see the server log" and body["type"] == "server_error"
    assert "secret" not in json.dumps(body)
    logged = [r for r in caplog.records if r.name == "inferplug.server.app"]
    assert logged and logged[0].exc_info[0] is ValueError  # the traceback is in the log
    assert metric(server, "/v1/chat/completions", "500") == 1


INTERNAL = "device lost: CUDA error at /opt/secret/kernels.cu:42"


def test_a_stream_error_ends_each_open_choice_and_counts_as_500(server_factory, tiny_backend, caplog):
    server = server_factory(create_app(Faulty(tiny_backend, RuntimeError(INTERNAL), after=2)))
    body = {"model": "tiny-llama", "messages": MESSAGES, "n": 2, "max_tokens": 8, "temperature": 1.0,
            "stream": True, "ignore_eos": True}
    with caplog.at_level(logging.ERROR, logger="inferplug.server.routes"):
        with httpx.stream("POST", server.url + "/chat/completions", json=body, timeout=60) as reply:
            lines = [line.removeprefix("data: ") for line in reply.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    errors = [c["error"] for c in chunks if "error" in c]
    # the details (a path, a device error) go to the log, not to the client
    assert len(errors) == 2 and all(e["message"].startswith("generation failed") for e in errors)
    assert "secret" not in json.dumps(chunks) and INTERNAL in caplog.text
    finishes = {c["choices"][0]["index"]: c["choices"][0]["finish_reason"]
                for c in chunks if c.get("choices") and c["choices"][0]["finish_reason"]}
    assert finishes == {0: "error", 1: "error"}
    assert metric(server, "/v1/chat/completions", "500") == 1
    assert metric(server, "/v1/chat/completions", "ok") == 0


def test_a_whole_response_that_fails_keeps_its_internals_in_the_log(server_factory, tiny_backend, caplog):
    server = server_factory(create_app(Faulty(tiny_backend, RuntimeError(INTERNAL), after=2)))
    body = {"model": "tiny-llama", "messages": MESSAGES, "max_tokens": 8, "ignore_eos": True}
    with caplog.at_level(logging.ERROR, logger="inferplug.server.routes"):
        reply = httpx.post(server.url + "/chat/completions", json=body, timeout=60)
    assert reply.status_code == 500 and reply.json()["error"]["type"] == "server_error"
    assert "secret" not in reply.text and INTERNAL in caplog.text


@pytest.mark.parametrize("stream", [False, True])
def test_an_aborted_choice_reads_stop_but_is_counted_as_aborted(server_factory, tiny_backend, stream):
    server = server_factory(create_app(Faulty(tiny_backend, None, after=1)))
    kw = dict(model="tiny-llama", messages=MESSAGES, max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    if stream:
        chunks = list(server.client().chat.completions.create(stream=True, **kw))
        reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    else:
        reasons = [c.finish_reason for c in server.client().chat.completions.create(**kw).choices]
    assert reasons == ["stop"]  # OpenAI has no "abort"
    assert metric(server, "/v1/chat/completions", "aborted") == 1
    assert metric(server, "/v1/chat/completions", "ok") == 0
