"""Tool calling pieces that need no model: call schemas, tool_choice, parsing calls out of text, a required
choice's answer as calls whole, cut short or streamed."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from inferplug.errors import RequestError
from inferplug.frontend.forced_call import ForcedCallStream, forced_calls
from inferplug.frontend.tool_calls import call_schema, parse_tool_calls, select_tools, template_renders_tools
from inferplug.profile import Profile

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}


def test_tool_choice_selects_and_requires():
    assert select_tools([WEATHER, ADD], "auto") == ([WEATHER, ADD], False)
    assert select_tools([WEATHER, ADD], "none") == ([], False)
    assert select_tools([WEATHER, ADD], "any") == ([WEATHER, ADD], True)
    assert select_tools([WEATHER, ADD], {"type": "function", "function": {"name": "add"}}) == ([ADD], True)
    with pytest.raises(RequestError, match="not among the bound tools"):
        select_tools([WEATHER], "nope")


def test_call_schema_constrains_name_and_arguments():
    one = call_schema([WEATHER])
    assert one["properties"]["name"]["enum"] == ["get_weather"]
    assert one["properties"]["arguments"] == WEATHER["function"]["parameters"]
    assert len(call_schema([WEATHER, ADD])["anyOf"]) == 2


@pytest.mark.parametrize("text", [
    '{"name": "add", "arguments": {"a": 1, "b": 2}}',
    'Sure.\n```json\n{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}\n```',
    '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>',
    '[{"name": "add", "arguments": {"a": 1, "b": 2}}]',
])
def test_calls_are_parsed_from_every_usual_shape(text):
    calls = parse_tool_calls(text, [WEATHER, ADD])
    assert [(c.name, c.arguments) for c in calls] == [("add", {"a": 1, "b": 2})]
    assert calls[0].id.startswith("call_")


def test_prose_and_unknown_tools_are_not_calls():
    assert parse_tool_calls("The answer is {not json}.", [ADD]) == []
    assert parse_tool_calls('{"name": "rm_rf", "arguments": {}}', [ADD]) == []


@pytest.mark.parametrize(("file_name", "text", "renders"), [
    ("tools.jinja", "{% for m in messages %}{{ m.content }}{% endfor %}", False),
    ("chat.jinja", "{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}", True),
])
def test_tool_support_is_read_from_the_template_text_not_its_path(tmp_path, file_name, text, renders):
    (tmp_path / file_name).write_text(text)
    profile = Profile(backend="native", model={"path": str(tmp_path), "chat_template": str(tmp_path / file_name)})
    backend = SimpleNamespace(profile=profile, tokenizer=SimpleNamespace(chat_template=None))
    assert template_renders_tools(backend) is renders


def test_a_backends_streamed_call_pieces_become_calls_with_its_ids():
    from inferplug.backends.openai_sse import chunk_events
    from inferplug.frontend.tool_calls import calls_from_deltas

    pieces = [{"index": 0, "id": "call_remote1", "function": {"name": "add", "arguments": ""}},
              {"index": 0, "function": {"arguments": '{"a": 1, '}}, {"index": 0, "function": {"arguments": '"b": 2}'}},
              {"index": 1, "id": "call_cut", "function": {"name": "add", "arguments": '{"a": '}}]
    events = [e for p in pieces for e in chunk_events("r", {"choices": [{"index": 0, "delta": {"tool_calls": [p]}}]})]
    calls = calls_from_deltas([d for e in events for d in e.tool_calls])
    # the call cut short (max_tokens) stays a call, its partial arguments as the backend sent them (as OpenAI's)
    assert [(c.id, c.name, c.arguments, c.arguments_json()) for c in calls] == [
        ("call_remote1", "add", {"a": 1, "b": 2}, '{"a": 1, "b": 2}'), ("call_cut", "add", {}, '{"a": ')]


WHOLE = '{"name": "add", "arguments": {"a": 1, "b": {"c": [2, "}"]}}}'


@pytest.mark.parametrize("parallel", [False, True])
def test_a_required_answer_is_its_calls_at_every_cut(parallel):
    """Cut anywhere (max_tokens), a required choice's answer is still a call: the name (completed from the offered
    tools while the cut is inside it) and the arguments text so far; the whole answer is the parsed call."""
    text = f"[{WHOLE}, {WHOLE}]" if parallel else WHOLE
    first_args = text.index('{"a"')
    for cut in range(len(text) + 1):
        calls = forced_calls(text[:cut], [WEATHER, ADD], parallel)
        # cut before the name's first letter: the first offered tool; after it, the only one that starts so
        assert calls[0].name == ("add" if cut > text.index('"add"') + 1 else "get_weather"), cut
        assert all(c.name == "add" for c in calls[:-1]), cut
        if cut == len(text):
            assert [c.arguments for c in calls] == [{"a": 1, "b": {"c": [2, "}"]}}] * (2 if parallel else 1)
            assert all(c.partial is None for c in calls)
        elif cut >= first_args:
            whole_args = text[first_args:text.index("}}}", first_args) + 2]
            assert calls[0].arguments_json() == (text[first_args:cut] if calls[0].partial is not None
                                                 else json.dumps(json.loads(whole_args)))
    assert forced_calls('{"name": "get_w', [WEATHER, ADD], False)[0].name == "get_weather"
    assert [(c.name, c.partial) for c in forced_calls("", [WEATHER, ADD], parallel)] == [("get_weather", "")]


@pytest.mark.parametrize("text", [WHOLE, WHOLE[:45], WHOLE[:-1], WHOLE[:20], WHOLE[:3], ""])
def test_a_streamed_required_call_adds_up_to_the_whole_answers(text):
    """Fed in pieces of any size, the stream sends the id and name once, then arguments that join up to those of
    the whole answer parsed at once (the text itself when cut short)."""
    for size in (1, 2, 7, len(text) or 1):
        stream = ForcedCallStream([WEATHER, ADD])
        pieces = [d for i in range(0, len(text), size) for d in stream.feed(text[i:i + size])] + stream.finish()
        [want] = forced_calls(text, [WEATHER, ADD], parallel=False)
        assert [(p.id, p.name) for p in pieces[:1]] == [(stream.id, want.name)] and not any(p.name for p in pieces[1:])
        arguments = "".join(p.arguments for p in pieces)
        assert arguments == want.partial if want.partial is not None else json.loads(arguments) == want.arguments
        assert stream.cut is (want.partial is not None)
