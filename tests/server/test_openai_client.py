"""The official openai client against `inferplug serve` on loopback (CTranslate2 on a tiny model)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from inferplug.types import Request, SamplingParams

MESSAGES = [{"role": "user", "content": "hello there"}]


def direct_text(backend, **request) -> str:
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    return "".join(e.text for e in backend.generate_sync(Request(params=params, **request)))


def test_models_lists_the_served_name(live_server):
    ids = [m.id for m in live_server.client().models.list()]
    assert ids[0] == "tiny-llama" and "tiny" in ids


def test_chat_completion_matches_the_backend(live_server):
    reply = live_server.client().chat.completions.create(
        model="tiny-llama", messages=MESSAGES, temperature=0, max_tokens=12, extra_body={"ignore_eos": True})
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == direct_text(live_server.backend, messages=MESSAGES)
    assert choice.finish_reason == "length"
    assert reply.usage.completion_tokens == 12 and reply.usage.prompt_tokens > 0
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 12
    assert reply.usage.prompt_tokens_details.cached_tokens == 0


def test_completion_stream_equals_whole(live_server):
    client = live_server.client()
    kw = dict(model="tiny-llama", prompt="the weather is", temperature=0, max_tokens=12,
              extra_body={"ignore_eos": True})
    whole = client.completions.create(**kw)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert whole.choices[0].text == direct_text(live_server.backend, prompt="the weather is")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]


def test_chat_stream_with_usage(live_server):
    stream = live_server.client().chat.completions.create(
        model="tiny-llama", messages=MESSAGES, temperature=0, max_tokens=12, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == direct_text(live_server.backend, messages=MESSAGES)
    assert all(c.usage is None for c in chunks[:-1])
    usage = chunks[-1].usage
    assert usage.completion_tokens == 12 and usage.prompt_tokens_details.cached_tokens >= 0


def test_n_choices(live_server):
    client = live_server.client()
    kw = dict(model="tiny-llama", messages=MESSAGES, n=3, temperature=1.0, seed=7, max_tokens=8)
    reply = client.chat.completions.create(**kw)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert all(c.finish_reason in ("stop", "length") for c in reply.choices)
    assert 3 <= reply.usage.completion_tokens <= 24
    streamed = list(client.chat.completions.create(stream=True, **kw))
    assert {c.choices[0].index for c in streamed if c.choices} == {0, 1, 2}


def test_stop_string_ends_the_choice(live_server):
    client = live_server.client()
    full = direct_text(live_server.backend, prompt="the weather is")
    stop = full[4:6]
    reply = client.completions.create(model="tiny-llama", prompt="the weather is", temperature=0, max_tokens=12,
                                      stop=[stop], extra_body={"ignore_eos": True})
    assert reply.choices[0].text == full[: full.index(stop)]
    assert reply.choices[0].finish_reason == "stop"


def test_logprobs(live_server):
    reply = live_server.client().chat.completions.create(
        model="tiny-llama", messages=MESSAGES, temperature=0, max_tokens=5, logprobs=True,
        extra_body={"ignore_eos": True})
    content = reply.choices[0].logprobs.content
    assert len(content) == 5 and all(t.logprob <= 0 for t in content)
    assert "".join(t.token for t in content) == reply.choices[0].message.content


def test_batch_of_prompts(live_server):
    reply = live_server.client().completions.create(model="tiny-llama", prompt=["one", "two"], n=2, temperature=0,
                                                    max_tokens=4, extra_body={"ignore_eos": True})
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    assert reply.choices[0].text == reply.choices[1].text
    assert reply.usage.completion_tokens == 16


@pytest.mark.parametrize("kw, error, param", [
    (dict(max_tokens=-1), openai.BadRequestError, "max_tokens"),
    (dict(temperature="hot"), openai.BadRequestError, "temperature"),
    (dict(temperature=5), openai.BadRequestError, "temperature"),
    (dict(seed=2**64), openai.BadRequestError, "seed"),
    (dict(seed=-1), openai.BadRequestError, "seed"),
    (dict(model="no-such-model"), openai.NotFoundError, "model"),
    (dict(logit_bias={"5": 1}), openai.BadRequestError, "logit_bias"),  # the CTranslate2 backend cannot honour it
    (dict(messages=[{"role": "user", "content": "word " * 400}]), openai.BadRequestError, "messages"),
])
def test_bad_requests_get_4xx_and_the_server_keeps_serving(live_server, kw, error, param):
    client = live_server.client()
    args = dict(model="tiny-llama", messages=MESSAGES, max_tokens=4) | kw
    with pytest.raises(error) as info:
        client.chat.completions.create(**args)
    assert info.value.body["param"] == param and info.value.body["message"]
    assert client.chat.completions.create(model="tiny-llama", messages=MESSAGES, max_tokens=2).choices


def test_malformed_json_and_oversized_body(live_server):
    url = live_server.url + "/chat/completions"
    json_header = {"content-type": "application/json"}
    bad = httpx.post(url, content=b'{"model": "tiny-llama", "messages": [', headers=json_header)
    assert bad.status_code == 400 and "JSON" in bad.json()["error"]["message"]
    wrong = httpx.post(live_server.url + "/completions", json={"model": "tiny-llama", "prompt": 5}).json()["error"]
    assert wrong["param"] == "prompt" and "wrong type" in wrong["message"] and "list[int]" in wrong["message"]
    huge = {"model": "tiny-llama", "messages": [{"role": "user", "content": "x" * 100_000}]}
    too_big = httpx.post(url, content=json.dumps(huge), headers={"content-type": "application/json"})
    assert too_big.status_code == 413 and "limit" in too_big.json()["error"]["message"]
    assert httpx.get(live_server.url.removesuffix("/v1") + "/health").json() == {"status": "ok"}


def test_api_key_is_enforced(server_factory, tiny_backend):
    server = server_factory(tiny_backend, api_key="s3cret-key")
    missing = httpx.get(server.url + "/models")  # the openai client always sends a key
    assert missing.status_code == 401 and "missing" in missing.json()["error"]["message"]
    with pytest.raises(openai.AuthenticationError) as wrong:
        server.client(api_key="not-the-key").chat.completions.create(model="tiny-llama", messages=MESSAGES)
    assert wrong.value.status_code == 401 and "s3cret" not in json.dumps(wrong.value.body)
    assert server.client(api_key="s3cret-key").models.list().data
    assert httpx.get(server.url.removesuffix("/v1") + "/health").status_code == 200


def test_metrics_report_latencies_and_backend_state(live_server):
    live_server.client().completions.create(model="tiny-llama", prompt="hi", max_tokens=4, temperature=0,
                                            extra_body={"ignore_eos": True})
    text = httpx.get(live_server.url.removesuffix("/v1") + "/metrics").text
    for name in ("inferplug_time_to_first_token_seconds_count", "inferplug_time_per_output_token_seconds_count",
                 "inferplug_num_requests_running", "inferplug_num_requests_waiting",
                 "inferplug_kv_cache_usage_ratio", "inferplug_prefix_cache_hit_rate"):
        assert name in text
    count = next(line for line in text.splitlines() if line.startswith("inferplug_time_to_first_token_seconds_count"))
    assert float(count.split()[-1]) >= 1


def test_an_endpoint_not_served_says_what_is(live_server):
    with pytest.raises(openai.NotFoundError) as info:
        live_server.client().embeddings.create(model="tiny-llama", input="hello")
    body = info.value.body
    assert body["code"] == "not_found" and "POST /v1/embeddings is not served here" in body["message"]
    assert "/v1/chat/completions" in body["message"]


def test_a_request_without_a_model_gets_the_served_one(live_server):
    reply = httpx.post(live_server.url + "/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=60)
    assert reply.status_code == 200 and reply.json()["model"] == "tiny-llama"
