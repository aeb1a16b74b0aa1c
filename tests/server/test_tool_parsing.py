"""Tool calls parsed out of hostile or looping model output in linear time, nested output that is no call, and a
history with malformed tool calls: a 400 naming the shape to send, not a 500."""

from __future__ import annotations

import time

import httpx
import pytest

from inferplug.frontend.tool_calls import parse_tool_calls
from inferplug.server.tool_output import ToolCallText

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize("text", [
    '<tool_call>{"a":1' + " " * 20000 + "x",  # the issue's input: O(W^2) backtracking under the old pattern
    '<tool_call>{"a":1' + " " * 20000 + "\n}",
    "{" * 20000,
    '{"a": ' * 5000,
    "[" * 20000,  # nested past the decoder's recursion limit
    "<tool_call>" * 5000,
    '{"name": "f", "arguments": "' + "[" * 20000 + '"}',  # its arguments' text nested past the limit
])
def test_hostile_output_parses_to_no_call_within_a_bound(text):
    started = time.monotonic()
    assert parse_tool_calls(text, TOOLS) == []
    assert time.monotonic() - started < 1.0  # a bound for a hang: 20k characters, not a timing


def test_a_call_after_whitespace_and_junk_is_still_found():
    text = "<tool_call>" + " " * 1000 + '{"name": "f", "arguments": {"x": 1}}' + " " * 1000 + "</tool_call>"
    assert [(c.name, c.arguments) for c in parse_tool_calls(text, TOOLS)] == [("f", {"x": 1})]
    nested = "[" * 3000 + ' {"name": "f", "arguments": {}}'
    assert [c.name for c in parse_tool_calls(nested, TOOLS)] == ["f"]


@pytest.mark.parametrize("required", [False, True])
def test_a_held_answer_of_spaces_streams_in_linear_time(required):
    held = ToolCallText(TOOLS, parallel=False, required=required)
    started = time.monotonic()
    for _ in range(50000):
        assert held.feed(" ") == ("", [])
    content, calls = held.finish()
    # auto: the spaces were no call; a required choice answers with its call whatever the text
    assert (content, [c.name for c in calls]) == (("", ["f"]) if required else (" " * 50000, []))
    assert time.monotonic() - started < 2.0  # a bound for a hang


def streamed(text: str, cut: int) -> tuple[str, list]:
    """(content, calls) of `text` streamed in two pieces, cut at `cut`."""
    tool_text = ToolCallText(TOOLS, parallel=False, required=False)
    content, pieces = "", []
    for piece in (text[:cut], text[cut:]):
        sent, more = tool_text.feed(piece)
        content, pieces = content + sent, pieces + more
    held, more = tool_text.finish()
    return content + held, [(p.name, p.arguments) for p in pieces + more]


@pytest.mark.parametrize("name, content", [("f", "Let me check.\n"), ("g", None)])
def test_prose_then_a_tagged_call_is_content_beside_the_call_streamed_or_whole(name, content):
    """Qwen's models often write a sentence before their <tool_call>: the prose is content and the call a call, as
    vLLM's hermes parser splits them, at every cut of the stream; a call to a tool not offered (g) is all content."""
    text = 'Let me check.\n<tool_call>{"name": "%s", "arguments": {"x": 1}}</tool_call>' % name
    whole_content, whole_calls = ToolCallText(TOOLS, parallel=False, required=False).split(text)
    want = (content, [("f", '{"x": 1}')]) if content else (text, [])
    assert (whole_content, [(c.name, c.arguments_json()) for c in whole_calls]) == want
    for cut in range(len(text) + 1):
        assert streamed(text, cut) == want, cut


@pytest.mark.parametrize("calls", [
    [{"foo": 1}],
    "not a list",
    [1, 2],
    [{"id": "c1", "type": "function", "function": {"arguments": "{}"}}],
    [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "[1, 2]"}}],
])
def test_malformed_tool_calls_in_the_history_are_a_400(live_server, calls):
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": calls},
               {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
    reply = httpx.post(live_server.url + "/chat/completions", timeout=60,
                       json={"model": "tiny-llama", "messages": history, "max_tokens": 2})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "messages" and "tool_calls" in error["message"].replace("tool call", "tool_calls")


def test_arguments_that_are_not_json_are_a_cut_calls_text_even_nested_deep(live_server):
    """A cut call's partial arguments (not JSON) come back in the history as its text, as OpenAI takes them: 20,000
    open brackets are text too (no RecursionError, no 500); here too long for the context, which the 400 says."""
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "[" * 20000}}]
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": calls},
               {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
    reply = httpx.post(live_server.url + "/chat/completions", timeout=60,
                       json={"model": "tiny-llama", "messages": history, "max_tokens": 2})
    assert reply.status_code == 400 and "the context holds 512" in reply.json()["error"]["message"], reply.text


def test_qwen35s_xml_calls_are_parsed_with_their_schemas_types():
    """Qwen3-Coder's and Qwen3.5's call form (vLLM's qwen3_coder parser): a string stays text, lines and all; a
    number, a boolean and an object are their JSON; an unknown function and a call cut short are none."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
        "where": {"type": "object"}}}}},
        {"type": "function", "function": {"name": "note", "parameters": {"type": "object"}}}]
    text = ("I'll check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\nCA\n</parameter>\n"
            "<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n"
            '<parameter=where>\n{"lat": 37.7}\n</parameter>\n</function>\n</tool_call>\n'
            "<tool_call>\n<function=note>\n<parameter=text>\n42\n</parameter>\n</function>\n</tool_call>\n"
            "<tool_call>\n<function=unknown>\n</function>\n</tool_call>\n"
            "<tool_call>\n<function=note>\n<parameter=text>\ncut")
    calls = [(c.name, c.arguments) for c in parse_tool_calls(text, tools)]
    assert calls == [("get_weather", {"city": "San Francisco\nCA", "days": 3, "metric": True, "where": {"lat": 37.7}}),
                     ("note", {"text": "42"})]


def test_hostile_xml_calls_parse_within_a_bound():
    started = time.monotonic()
    text = "<tool_call><function=f>" + "<parameter=x>" * 20000 + "</function>"
    assert [c.name for c in parse_tool_calls(text, TOOLS)] == ["f"]
    assert parse_tool_calls("<tool_call>" + "<function=f>" * 20000, TOOLS) == []
    assert time.monotonic() - started < 1.0  # a bound for a hang
