"""Reasoning parsers: <think> text split from the answer on fixed strings, streamed in any cut, and through the
native engine's output stage (a tiny random model driven by a JSON-schema pattern to write the tags)."""

from __future__ import annotations

import pytest

from inferplug.errors import ProfileError
from inferplug.stages.reasoning import ReasoningSplitter, detect_parser, split_reasoning
from inferplug.types import Request, SamplingParams

# The tiny model writes "<think>letters</think>letters" as a JSON string: the pattern is the only freedom.
THINK_SCHEMA = {"type": "string", "pattern": "<think>[a-z]{2,6}</think>[a-z]{2,6}"}


@pytest.mark.parametrize("parser, text, want", [
    ("qwen3", "<think>plan it</think>The answer.", ("The answer.", "plan it")),
    ("qwen3", "No thinking here.", ("No thinking here.", "")),
    ("qwen3", 'x<think>a</think>y', ("xy", "a")),
    ("deepseek_r1", "plan it</think>The answer.", ("The answer.", "plan it")),
    ("deepseek_r1", "<think>plan it</think>The answer.", ("The answer.", "plan it")),
    ("deepseek_r1", "still thinking when max_tokens hit", ("", "still thinking when max_tokens hit")),
    ("deepseek_r1", "a</think>b<think>c", ("b<think>c", "a")),
])
def test_fixed_strings(parser, text, want):
    assert split_reasoning(text, parser) == want


@pytest.mark.parametrize("parser", ["qwen3", "deepseek_r1"])
def test_every_cut_of_a_stream_gives_the_whole_split(parser):
    text = "<think>weigh < and </ thinks</think>answer </thin k"
    want = split_reasoning(text, parser)
    for cut in range(len(text) + 1):
        splitter = ReasoningSplitter(parser)
        parts = [splitter.feed(text[:cut]), splitter.feed(text[cut:], final=True)]
        assert ("".join(p[0] for p in parts), "".join(p[1] for p in parts)) == want, cut
    for size in (1, 2, 3):  # and token-sized pieces: no part of a tag ever reaches either side
        splitter = ReasoningSplitter(parser)
        pieces = [splitter.feed(text[i:i + size]) for i in range(0, len(text), size)] + [splitter.feed("", True)]
        assert all("<" not in c or "<think>" not in c for c, _ in pieces[:-1])
        assert ("".join(c for c, _ in pieces), "".join(r for _, r in pieces)) == want


def test_detection_from_the_chat_template():
    r1 = "{{ messages }}{% if add_generation_prompt %}<|Assistant|><think>\n{% endif %}{# strips </think> #}"
    assert detect_parser(r1, "<|User|>hi<|Assistant|><think>\n") == "deepseek_r1"
    assert detect_parser("... <think> ... </think> ...", "<|im_start|>assistant\n") == "qwen3"
    assert detect_parser("{{ messages }}", "<|im_start|>assistant\n") is None


def test_unknown_parser_name_is_a_profile_error(tmp_path, tiny_llama_dir):
    from inferplug.profile import load_profile

    path = tmp_path / "bad.toml"
    path.write_text(f'backend = "native"\n[model]\npath = "{tiny_llama_dir}"\nreasoning_parser = "r2d2"\n')
    with pytest.raises(ProfileError, match="r2d2.*deepseek_r1"):
        load_profile(path)


@pytest.fixture(scope="module")
def thinking_backend(tiny_llama_dir):
    """The tiny Llama on the native engine with the qwen3 parser named in its profile."""
    from inferplug.backends.registry import close_backend, get_backend
    from inferplug.profile import ModelSource, Profile

    profile = Profile(name="tiny-think", backend="native", dtype="float32",
                      model=ModelSource(path=tiny_llama_dir, served_name="tiny-think", reasoning_parser="qwen3"))
    yield get_backend(profile)
    close_backend(profile)


def test_the_engine_output_stage_splits_a_forced_think(thinking_backend):
    params = SamplingParams(temperature=0, max_tokens=40, json_schema=THINK_SCHEMA)
    events = thinking_backend.generate_sync(Request(messages=[{"role": "user", "content": "hi"}], params=params))
    content, reasoning = "".join(e.text for e in events), "".join(e.reasoning for e in events)
    assert reasoning.isalpha() and 2 <= len(reasoning) <= 6
    assert content.startswith('"') and content.endswith('"') and content[1:-1].isalpha()
    tokens = sum(len(e.token_ids) for e in events)  # max_tokens counts both parts
    assert events[-1].usage.completion_tokens == tokens
    stats = thinking_backend.stats()
    assert stats["kv_blocks_used"] == 0 and stats["kv_blocks_free"] == stats["kv_blocks_total"]


def test_server_and_remote_backend_carry_reasoning_content(thinking_backend):
    """The openai client reads reasoning_content (whole and streamed); our remote backend parses it back."""
    from inferplug.backends.openai import OpenAIBackend
    from inferplug.hardware import probe
    from inferplug.profile import OpenAIOptions, Profile
    from inferplug.resolver import resolve
    from tests.server.conftest import start_server

    server = start_server(thinking_backend)
    try:
        client = server.client()
        fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": THINK_SCHEMA}}
        kw = dict(model="tiny-think", messages=[{"role": "user", "content": "hi"}], temperature=0, max_tokens=40,
                  response_format=fmt)
        whole = client.chat.completions.create(**kw).choices[0].message
        reasoning = whole.model_extra["reasoning_content"]
        assert reasoning.isalpha() and "<think>" not in whole.content and whole.content.endswith('"')
        deltas = [c.choices[0].delta for c in client.chat.completions.create(stream=True, **kw) if c.choices]
        assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == reasoning
        assert "".join(d.content or "" for d in deltas) == whole.content

        profile = Profile(name="remote", backend="openai", openai=OpenAIOptions(base_url=server.url))
        remote = OpenAIBackend(profile, resolve(profile, probe()))
        params = SamplingParams(temperature=0, max_tokens=40, json_schema=THINK_SCHEMA)
        events = remote.generate_sync(Request(messages=[{"role": "user", "content": "hi"}], params=params))
        assert "".join(e.reasoning for e in events) == reasoning
        assert "".join(e.text for e in events) == whole.content
        remote.close()
    finally:
        server.stop()


# gpt-oss's harmony reply, forced on the tiny model as a JSON string (its byte tokens spell the control tokens, which
# the openai_gptoss parser reads as text): its analysis, then a call to the one tool with empty arguments
HARMONY_CALL = {"type": "string", "pattern": r"<\|channel\|>analysis<\|message\|>[a-z]{2,6}<\|end\|><\|start\|>"
                                             r"assistant to=functions\.clock<\|channel\|>commentary json"
                                             r"<\|message\|>\{\}<\|call\|>"}
CLOCK = {"type": "function", "function": {"name": "clock", "description": "The time now",
                                          "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture(scope="module")
def harmony_backend(tiny_llama_dir):
    from inferplug.backends.registry import close_backend, get_backend
    from inferplug.profile import ModelSource, Profile

    profile = Profile(name="tiny-harmony", backend="native", dtype="float32",
                      model=ModelSource(path=tiny_llama_dir, served_name="tiny-harmony",
                                        reasoning_parser="openai_gptoss"))
    yield get_backend(profile)
    close_backend(profile)


def test_a_harmony_reply_through_the_server_is_reasoning_and_a_tool_call(harmony_backend):
    """The official openai client gets the analysis as reasoning_content and the functions.clock message as a
    tool call (whole and streamed), finishing "tool_calls"."""
    from tests.server.conftest import start_server

    server = start_server(harmony_backend)
    try:
        client = server.client()
        fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": HARMONY_CALL}}
        kw = dict(model="tiny-harmony", messages=[{"role": "user", "content": "time?"}], temperature=0,
                  max_tokens=200, response_format=fmt, tools=[CLOCK])
        choice = client.chat.completions.create(**kw).choices[0]
        reasoning = choice.message.model_extra["reasoning_content"]
        [call] = choice.message.tool_calls
        assert reasoning.isalpha() and 2 <= len(reasoning) <= 6
        assert (call.function.name, call.function.arguments, choice.finish_reason) == ("clock", "{}", "tool_calls")
        assert not choice.message.content
        chunks = [c.choices[0] for c in client.chat.completions.create(stream=True, **kw) if c.choices]
        assert "".join((c.delta.model_extra or {}).get("reasoning_content") or "" for c in chunks) == reasoning
        streamed = [t for c in chunks for t in c.delta.tool_calls or []]
        assert streamed[0].function.name == "clock" and chunks[-1].finish_reason == "tool_calls"
        assert "".join(t.function.arguments or "" for t in streamed) == "{}"
    finally:
        server.stop()


HARMONY_PREAMBLE_CALL = {"type": "string", "pattern": r"<\|channel\|>commentary<\|message\|>[a-z]{2,6}<\|end\|>"
                                                      r"<\|start\|>assistant to=functions\.clock<\|channel\|>"
                                                      r"commentary json<\|message\|>\{\}<\|call\|>"}


def test_a_harmony_preamble_is_content_beside_the_call_and_no_call_comes_unoffered(harmony_backend):
    """The commentary the user sees before a call is content, whole as streamed; with no tools offered (or
    tool_choice "none") a functions.clock message is no tool call: it is reasoning, as one to a tool not run."""
    from tests.server.conftest import start_server

    server = start_server(harmony_backend)
    try:
        client = server.client()
        fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": HARMONY_PREAMBLE_CALL}}
        kw = dict(model="tiny-harmony", messages=[{"role": "user", "content": "time?"}], temperature=0,
                  max_tokens=200, response_format=fmt)
        choice = client.chat.completions.create(tools=[CLOCK], **kw).choices[0]
        [call] = choice.message.tool_calls
        streamed = [c.choices[0] for c in client.chat.completions.create(stream=True, tools=[CLOCK], **kw)
                    if c.choices]
        assert choice.message.content and choice.message.content.strip('"').isalpha()
        assert "".join(c.delta.content or "" for c in streamed) == choice.message.content
        assert (call.function.name, choice.finish_reason) == ("clock", "tool_calls")
        for offered in (dict(), dict(tools=[CLOCK], tool_choice="none")):
            unoffered = client.chat.completions.create(**offered, **kw).choices[0]
            assert unoffered.message.tool_calls is None and unoffered.finish_reason != "tool_calls"
            assert unoffered.message.content == choice.message.content
            assert "{}" in unoffered.message.model_extra["reasoning_content"]
    finally:
        server.stop()
