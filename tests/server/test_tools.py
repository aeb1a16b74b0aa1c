"""OpenAI tools and response formats through the server, with the official client, on the native engine (a tiny
random Llama: constrained decoding makes its calls well-formed whatever its weights say), and the bad input
each gets a 400 for while other requests keep flowing."""

from __future__ import annotations

import json

import openai
import pytest

from inferplug.frontend.requests import build_request

CITY = {"type": "string", "enum": ["Paris", "Rome"]}
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": CITY, "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "days"]}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}, "b": {"type": "boolean"}}, "required": ["a", "b"]}}}
ASK = [{"role": "user", "content": "Paris?"}]
TYPES = {"string": str, "integer": int, "boolean": bool}
GREEDY = dict(model="tiny", temperature=0, max_tokens=120)


@pytest.fixture
def client(native, server_factory):
    return server_factory(native).client()


def check_arguments(tool: dict, arguments: str) -> dict:
    """The call's arguments parsed, with the schema's required keys, enums and integer types."""
    schema, args = tool["function"]["parameters"], json.loads(arguments)
    assert set(schema["required"]) <= set(args)
    for key, value in args.items():
        spec = schema["properties"][key]
        assert value in spec.get("enum", [value]) and isinstance(value, TYPES[spec["type"]])
        assert spec.get("minimum", value) <= value <= spec.get("maximum", value)
    return args


def streamed(client, **kw) -> tuple[dict[int, dict], str | None, str]:
    """(tool calls by index, as the deltas built them; the finish_reason; the content)."""
    calls: dict[int, dict] = {}
    finish, content = None, ""
    for chunk in client.chat.completions.create(stream=True, **kw):
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for delta in choice.delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"id": delta.id, "name": "", "arguments": ""})
            call["name"] += delta.function.name or ""
            call["arguments"] += delta.function.arguments or ""
        finish = choice.finish_reason or finish
    return calls, finish, content


@pytest.mark.parametrize("parallel", [False, True])
def test_a_required_call_is_well_formed_whole_and_streamed(client, parallel):
    kw = dict(messages=ASK, tools=[WEATHER], tool_choice="required", parallel_tool_calls=parallel, **GREEDY)
    whole = client.chat.completions.create(**kw).choices[0]
    # a random model repeats array items until max_tokens: the whole calls come back, then the one it was cut in
    assert whole.finish_reason == ("length" if parallel else "tool_calls") and whole.message.content is None
    made = whole.message.tool_calls
    assert made and all(c.function.name == "weather" for c in made) and (len(made) == 1 or parallel)
    cut = [made.pop().function.arguments] if whole.finish_reason == "length" else []
    answers = [check_arguments(WEATHER, c.function.arguments) for c in made]
    calls, finish, content = streamed(client, **kw)
    assert finish == whole.finish_reason and content == ""
    sent = [c["arguments"] for c in calls.values()]
    assert [json.loads(a) for a in sent[:len(answers)]] == answers and sent[len(answers):] == cut
    assert all(c["name"] == "weather" and c["id"].startswith("call_") for c in calls.values())


@pytest.mark.parametrize(("tools", "choice"), [
    ([WEATHER], "required"), ([WEATHER, ADD], {"type": "function", "function": {"name": "weather"}})])
@pytest.mark.parametrize("max_tokens", [1, 14, 48])  # cut before the name, in it, in the arguments
def test_a_required_or_named_call_cut_by_max_tokens_is_still_its_call(client, native, tools, choice, max_tokens):
    """As OpenAI and vLLM answer it: in tool_calls, never content, with finish_reason "length" and the text the
    engine generated after `"arguments": ` as the arguments (none yet when the cut came first), whole and
    streamed alike."""
    kw = dict(messages=ASK, tools=tools, tool_choice=choice, parallel_tool_calls=False, **GREEDY)
    kw["max_tokens"] = max_tokens
    prepared = build_request(native, messages=ASK, tools=tools, tool_choice=choice,
                             options={"temperature": 0, "max_tokens": max_tokens})
    text = "".join(e.text for e in native.generate_sync(prepared.request))
    head = '{"name": "weather", "arguments": '
    assert head.startswith(text) or text.startswith(head)  # the engine's answer, cut: the reference
    whole = client.chat.completions.create(**kw).choices[0]
    [call] = whole.message.tool_calls
    assert whole.finish_reason == "length" and whole.message.content is None
    assert (call.function.name, call.function.arguments) == ("weather", text[len(head):])
    calls, finish, content = streamed(client, **kw)
    assert finish == "length" and content == ""
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [("weather", text[len(head):])]


def test_a_required_call_cut_by_a_stop_string_is_still_its_call_and_finishes_with_stop(client):
    """Not "tool_calls": that finish says the calls are whole; this one's arguments stop where the stop string was."""
    kw = dict(messages=ASK, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False, stop=["Rome"],
              **GREEDY)  # the tiny model's greedy call starts {"city": "Rome", ...
    whole = client.chat.completions.create(**kw).choices[0]
    [call] = whole.message.tool_calls
    assert (whole.finish_reason, call.function.name, call.function.arguments) == ("stop", "weather", '{"city": "')
    calls, finish, content = streamed(client, **kw)
    assert (finish, content, [c["arguments"] for c in calls.values()]) == ("stop", "", ['{"city": "'])


def test_a_named_tool_choice_calls_that_function(client):
    named = {"type": "function", "function": {"name": "add"}}
    choice = client.chat.completions.create(messages=ASK, tools=[WEATHER, ADD], tool_choice=named,
                                            **GREEDY).choices[0]
    assert [c.function.name for c in choice.message.tool_calls] == ["add"]
    check_arguments(ADD, choice.message.tool_calls[0].function.arguments)


def test_tool_choice_none_gives_text(client, native):
    kw = dict(messages=ASK, **GREEDY | {"max_tokens": 8})
    with_none = client.chat.completions.create(tools=[WEATHER], tool_choice="none", **kw).choices[0]
    without = client.chat.completions.create(**kw).choices[0]
    assert with_none.message.tool_calls is None and with_none.finish_reason == "length"
    assert with_none.message.content == without.message.content  # the tools are not even shown to the model


def test_a_tool_result_in_the_history_is_rendered_by_the_chat_template(client, native):
    call = {"id": "call_1", "type": "function", "function": {"name": "weather",
                                                             "arguments": '{"city": "Paris", "days": 2}'}}
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 22 C"}]
    request = build_request(native, messages=history, tools=[WEATHER]).request
    rendered = native.apply_chat_template(request.messages)
    assert "sunny, 22 C" in rendered and '"city": "Paris"' in rendered and "None" not in rendered
    answer = client.chat.completions.create(messages=history, tools=[WEATHER], **GREEDY, stream=False)
    assert answer.usage.prompt_tokens == len(native.tokenizer.encode(rendered, add_special_tokens=False))


def test_json_schema_and_json_object_output(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER["function"]["parameters"]}}
    choice = client.chat.completions.create(messages=ASK, response_format=fmt, **GREEDY).choices[0]
    assert choice.finish_reason == "stop"
    check_arguments(WEATHER, choice.message.content)
    obj = client.chat.completions.create(messages=ASK, response_format={"type": "json_object"},
                                         **GREEDY | {"max_tokens": 200}).choices[0]
    assert obj.finish_reason == "length" or isinstance(json.loads(obj.message.content), dict)


@pytest.mark.parametrize(("kw", "param", "says"), [
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "a": {"$ref": "#/$defs/missing"}}}}}], tool_choice="required"), "json_schema", "cannot be compiled"),
    (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice",
     "not among the bound tools"),
    (dict(tool_choice="required"), "tool_choice", "needs tools"),
    (dict(response_format={"type": "xml"}), "response_format", "response_format must be"),
])
def test_bad_tool_input_is_a_400_and_others_keep_flowing(client, kw, param, says):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(messages=ASK, **GREEDY, **kw)
    assert caught.value.body["param"] == param and says in caught.value.body["message"]
    assert client.chat.completions.create(messages=ASK, **GREEDY | {"max_tokens": 4}).choices[0].message.content


def test_tools_on_a_backend_that_cannot_constrain_are_a_400_naming_it(live_server):
    client = live_server.client()
    for kw in (dict(tools=[WEATHER]), dict(response_format={"type": "json_object"})):
        with pytest.raises(openai.BadRequestError, match="ctranslate2 backend"):
            client.chat.completions.create(model="tiny-llama", messages=ASK, **kw)
    assert client.chat.completions.create(model="tiny-llama", messages=ASK, max_tokens=4).choices[0].message
