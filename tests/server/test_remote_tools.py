"""Tools through the remote backend: ChatInferPlug on an `openai` profile pointed at our own server (the tiny
native model on loopback, behind a recording proxy). The remote constrains a required or named call itself,
and its streamed `tool_calls` come back as the model's tool calls, with the remote's call ids."""

from __future__ import annotations

import json

import pytest

from tests.server.test_remote_backend import flaky_proxy
from tests.server.test_tools import ADD, ASK, WEATHER, check_arguments


@pytest.fixture
def remote_chat(native, server_factory):
    """(a ChatInferPlug on an openai profile, the proxy app recording what it sends and relays)."""
    from langchain_inferplug import ChatInferPlug

    from inferplug.backends.registry import close_backend
    from inferplug.profile import OpenAIOptions, Profile

    app = flaky_proxy(server_factory(native).url, failures=[])
    profile = Profile(name="remote-tiny", backend="openai", openai=OpenAIOptions(base_url=server_factory(app).url))
    yield ChatInferPlug(profile=profile, temperature=0, max_tokens=120), app
    close_backend(profile)


def relayed_ids(app) -> set[str]:
    """The call ids in the tool_calls deltas the remote server streamed."""
    chunks = [json.loads(line[5:]) for line in app.state.lines if line.startswith("data:") and "[DONE]" not in line]
    return {c["id"] for chunk in chunks for choice in chunk["choices"]
            for c in (choice.get("delta") or {}).get("tool_calls") or [] if c.get("id")}


@pytest.mark.parametrize(("tools", "choice", "called", "sent_choice"), [
    ([WEATHER], "any", WEATHER, "required"),
    ([WEATHER, ADD], "add", ADD, {"type": "function", "function": {"name": "add"}}),
])
def test_a_required_or_named_call_whole_and_streamed(remote_chat, native, tools, choice, called, sent_choice):
    model, app = remote_chat
    bound = model.bind_tools(tools, tool_choice=choice)
    whole = bound.invoke(ASK[0]["content"])
    body = app.state.bodies[-1]
    assert body["tool_choice"] == sent_choice and body["parallel_tool_calls"] is False
    assert [t["function"]["name"] for t in body["tools"]] == [t["function"]["name"] for t in tools
                                                              if choice == "any" or t is called]
    assert "response_format" not in body  # the remote constrains the call from tool_choice
    [call] = whole.tool_calls
    assert call["name"] == called["function"]["name"] and whole.content == ""
    args = check_arguments(called, json.dumps(call["args"]))
    assert call["id"] in relayed_ids(app) and whole.response_metadata["finish_reason"] == "tool_calls"

    chunks = list(bound.stream(ASK[0]["content"]))
    assert any(c.tool_call_chunks for c in chunks)  # our server sends each call whole, once the choice ends
    merged = sum(chunks[1:], chunks[0])
    [streamed] = merged.tool_calls
    assert (streamed["name"], streamed["args"]) == (call["name"], args)
    assert streamed["id"] in relayed_ids(app) and streamed["id"] != call["id"]
    assert merged.response_metadata["finish_reason"] == "tool_calls" and merged.content == ""
    assert native.stats()["kv_blocks_used"] == 0  # the remote's engine gave back every block


def test_response_format_is_forwarded_as_given(remote_chat):
    model, app = remote_chat
    schema = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
              "required": ["city"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "where", "schema": schema}}
    answer = model.invoke(ASK[0]["content"], response_format=fmt)
    assert app.state.bodies[-1]["response_format"] == fmt and "tools" not in app.state.bodies[-1]
    assert json.loads(answer.content)["city"] in ("Paris", "Rome")


@pytest.mark.parametrize("stream", [False, True])
def test_serve_on_a_remote_profile_relays_the_remotes_tool_calls(native, server_factory, stream):
    """`inferplug serve` on an openai profile: the remote's tool calls reach the client as tool_calls, ids kept."""
    from inferplug.backends.registry import close_backend, get_backend
    from inferplug.profile import OpenAIOptions, Profile

    app = flaky_proxy(server_factory(native).url, failures=[])
    profile = Profile(name="remote-tiny", backend="openai", openai=OpenAIOptions(base_url=server_factory(app).url))
    client = server_factory(get_backend(profile)).client()
    try:
        kw = dict(model="tiny", messages=ASK, temperature=0, max_tokens=120, tools=[WEATHER], tool_choice="required",
                  parallel_tool_calls=False)  # the random tiny model may never close an array of calls
        if stream:
            chunks = list(client.chat.completions.create(stream=True, **kw))
            pieces = [c for chunk in chunks for choice in chunk.choices for c in choice.delta.tool_calls or []]
            ids = {p.id for p in pieces if p.id}
            name = "".join(p.function.name or "" for p in pieces)
            arguments = "".join(p.function.arguments or "" for p in pieces)
            finish = [choice.finish_reason for chunk in chunks for choice in chunk.choices if choice.finish_reason]
        else:
            [choice] = client.chat.completions.create(**kw).choices
            [call] = choice.message.tool_calls
            ids, name, arguments, finish = {call.id}, call.function.name, call.function.arguments, [choice.finish_reason]
    finally:
        close_backend(profile)
    assert name == "weather" and finish == ["tool_calls"] and ids and ids <= relayed_ids(app)
    check_arguments(WEATHER, arguments)
