"""The [server] limits: each request over one gets a 400 in OpenAI's shape naming the limit's key (error.code) and
the field, before any work is queued for it; the tiny CTranslate2 backend serves the rest."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from inferplug.profile_server import ServerOptions

MESSAGES = [{"role": "user", "content": "hello there"}]


def nested_lists(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


def refused(server, path: str, body: dict, timeout: float = 60) -> dict:
    reply = httpx.post(server.url + path, json={"model": "tiny-llama", **body}, timeout=timeout)
    assert reply.status_code == 400, reply.text
    return reply.json()["error"]


def assert_names(error: dict, key: str, param: str) -> None:
    assert error["code"] == key and error["param"] == param and error["type"] == "invalid_request_error"
    assert f"[server] {key}" in error["message"] and f"--{key.replace('_', '-')}" in error["message"]


@pytest.mark.parametrize(("path", "body", "key", "param"), [
    ("/completions", {"prompt": [[1]] * 65}, "max_prompts", "prompt"),
    ("/completions", {"prompt": "hi", "n": 17}, "max_n", "n"),
    ("/chat/completions", {"messages": MESSAGES * 513}, "max_messages", "messages"),
    ("/chat/completions", {"messages": MESSAGES, "tools": [
        {"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]}, "max_tools", "tools"),
    ("/chat/completions", {"messages": MESSAGES, "stop": [f"s{i}" for i in range(17)]}, "max_stop", "stop"),
    ("/chat/completions", {"messages": MESSAGES, "stop": ["x"] * 10, "stop_token_ids": [1] * 7}, "max_stop", "stop"),
    ("/completions", {"prompt": "hi", "stop": ["y" * 257]}, "max_stop_chars", "stop"),
    ("/completions", {"prompt": "hi", "n": 16, "max_tokens": 8193}, "max_total_tokens", "max_tokens"),
    ("/chat/completions", {"messages": MESSAGES, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {f"p{i}": {} for i in range(257)}}}}},
     "max_schema_properties", "response_format"),
    ("/chat/completions", {"messages": MESSAGES, "tool_choice": "required", "tools": [
        {"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object", "properties": {
            f"p{j}": {"type": "string"} for j in range(65)}}}} for i in range(4)]}, "max_schema_properties", "tools"),
    ("/completions", {"prompt": "hi", "user": nested_lists(64)}, "max_json_depth", None),  # with the body: 65
    ("/completions", {"prompt": [[1]] * 64, "n": 2, "max_tokens": 1025}, "max_total_tokens", "max_tokens"),
    # values as pydantic reads them: a number in a string, beam search's best_of, no max_completion_tokens here
    ("/completions", {"prompt": "hi", "n": "17"}, "max_n", "n"),
    ("/chat/completions", {"messages": MESSAGES, "n": 17.0}, "max_n", "n"),
    ("/completions", {"prompt": "hi", "use_beam_search": True, "best_of": 40, "max_tokens": 4096}, "max_total_tokens",
     "max_tokens"),
    ("/completions", {"prompt": ["x"] * 64, "n": 16, "max_completion_tokens": 1, "max_tokens": 4096},
     "max_total_tokens", "max_tokens"),
])
def test_a_request_over_a_default_limit_is_a_400_naming_it(live_server, path, body, key, param):
    assert_names(refused(live_server, path, body), key, param)


def test_schema_bytes_and_prompt_tokens_follow_the_servers_options(server_factory, tiny_backend):
    server = server_factory(tiny_backend, options=ServerOptions(max_schema_bytes=200, max_prompt_tokens=40))
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {f"field{i}": {"type": "string"} for i in range(20)}}}}
    assert_names(refused(server, "/chat/completions", {"messages": MESSAGES, "response_format": schema}),
                 "max_schema_bytes", "response_format")
    big_tool = {"type": "function", "function": {"name": "f", "description": "d" * 300}}
    assert_names(refused(server, "/chat/completions", {"messages": MESSAGES, "tools": [big_tool]}),
                 "max_schema_bytes", "tools")
    assert_names(refused(server, "/completions", {"prompt": list(range(41))}), "max_prompt_tokens", "prompt")
    assert_names(refused(server, "/completions", {"prompt": "a b c d e " * 20}), "max_prompt_tokens", "prompt")
    assert_names(refused(server, "/chat/completions", {"messages": [{"role": "user", "content": "hello " * 40}]}),
                 "max_prompt_tokens", "messages")
    client = server.client()  # under the limits, the same server answers
    ok = client.completions.create(model="tiny-llama", prompt=list(range(1, 30)), max_tokens=2)
    assert ok.usage.prompt_tokens == 29
    assert client.chat.completions.create(model="tiny-llama", messages=MESSAGES, max_tokens=2).choices


def test_the_issues_8_mib_batch_of_one_token_prompts_is_refused_at_once(server_factory, tiny_backend):
    """An 8 MiB body of [[1],[1],...] with n=128: 2M prompts x 128 slots, refused before one request is built."""
    server = server_factory(tiny_backend)  # the default 8 MiB body limit
    count = (8 * 1024 * 1024 - 100) // 4
    body = b'{"model": "tiny-llama", "n": 128, "prompt": [' + b"[1]," * (count - 1) + b"[1]]}"
    started = time.monotonic()
    reply = httpx.post(server.url + "/completions", content=body, headers={"Content-Type": "application/json"},
                       timeout=120)
    # refused before it is parsed: its 2M values are over max_json_values
    assert reply.status_code == 413 and reply.json()["error"]["code"] == "max_json_values"
    assert time.monotonic() - started < 60  # a bound for a hang, not a timing
    fewer = b'{"model": "tiny-llama", "n": 128, "prompt": [' + b"[1]," * 99 + b"[1]]}"  # parsed: max_prompts then
    reply = httpx.post(server.url + "/completions", content=fewer, headers={"Content-Type": "application/json"})
    assert reply.status_code == 400 and reply.json()["error"]["code"] == "max_prompts"
    assert server.client().completions.create(model="tiny-llama", prompt="hi", max_tokens=2).choices


def test_a_count_limit_is_applied_before_the_request_is_validated(server_factory, tiny_backend):
    """20,000 messages are refused by counting them, not by validating each (~90 ms of the GIL that every stream's
    step waits on, issue 29): messages that would fail validation get the limit's error, not theirs."""
    server = server_factory(tiny_backend)
    error = refused(server, "/chat/completions", {"messages": [{"role": 5}] * 20_000})
    assert_names(error, "max_messages", "messages")
    assert_names(refused(server, "/completions", {"prompt": [[1]] * 65, "temperature": "hot"}), "max_prompts", "prompt")
    # under the limits, validation still names what is wrong
    assert "role" in refused(server, "/chat/completions", {"messages": [{"role": 5}]})["message"]
    # token ids sent as floats are one prompt, as validation reads them, not a batch of 70
    ids = httpx.post(server.url + "/completions", json={"model": "tiny-llama", "prompt": [1.0] * 70, "max_tokens": 1})
    assert ids.status_code == 200 and ids.json()["usage"]["prompt_tokens"] == 70


def test_the_official_client_sees_the_limit_as_a_bad_request(live_server):
    with pytest.raises(openai.BadRequestError) as caught:
        live_server.client().completions.create(model="tiny-llama", prompt="hi", n=17)
    assert caught.value.body["code"] == "max_n"


def test_the_limits_come_from_the_profile_the_environment_and_the_flags(tmp_path, monkeypatch):
    from inferplug.cli import build_parser
    from inferplug.commands.serve import apply_server_flags
    from inferplug.errors import ProfileError
    from inferplug.profile import load_profile

    path = tmp_path / "p.toml"
    path.write_text('backend = "openai"\n[server]\nmax_n = 4\ntenant_header = "X-Tenant"\n')
    monkeypatch.setenv("INFERPLUG_SERVER__MAX_PROMPTS", "7")
    profile = load_profile(str(path))
    assert (profile.server.max_n, profile.server.max_prompts, profile.server.tenant_header) == (4, 7, "X-Tenant")
    args = build_parser().parse_args(["serve", str(path), "--max-n", "8", "--queue-timeout-s", "2.5",
                                      "--allowed-host", "a.lan", "--allowed-host", "b.lan"])
    apply_server_flags(profile, args)
    assert (profile.server.max_n, profile.server.queue_timeout_s, profile.server.max_prompts) == (8, 2.5, 7)
    assert profile.server.allowed_hosts == ["a.lan", "b.lan"]
    flags = {a.dest.removeprefix("server_") for a in build_parser()._subparsers._group_actions[0].choices["serve"]
             ._actions if a.dest.startswith("server_")}
    assert flags == set(type(profile.server).model_fields)  # every [server] key has its flag, as the README says
    path.write_text('backend = "openai"\n[server]\nmax_nn = 4\n')
    with pytest.raises(ProfileError, match="max_n"):
        load_profile(str(path))


@pytest.mark.parametrize("ids", [[-1], [2**32 + 5], [1, 99999]])
def test_echo_of_token_ids_outside_the_vocabulary_is_a_400(live_server, ids):
    """Found by the schemathesis test: echo decoded the ids before any check, and the tokenizer overflowed (a 500)."""
    error = refused(live_server, "/completions", {"prompt": ids, "echo": True, "max_tokens": 1})
    assert error["param"] == "prompt" and "outside the vocabulary" in error["message"]


@pytest.mark.parametrize("path", ["/completions", "/chat/completions"])
@pytest.mark.parametrize("body", [
    b'{"model": "tiny-llama", "messages": ' + b"[" * 50_000,  # no commas: under max_json_values, too deep to parse
    # parsed, but too deep for what reads it: a schema 450 objects deep would hold a prompt worker for minutes
    b'{"model": "tiny-llama", "prompt": "hi", "messages": [{"role": "user", "content": "hi"}], "response_format": '
    b'{"type": "json_schema", "json_schema": {"name": "x", "schema": '
    + b'{"type": "object", "properties": {"x": ' * 450 + b"{}" + b"}}" * 450 + b"}}}",
])
def test_json_nested_too_deep_is_a_400_naming_it(live_server, path, body):
    reply = httpx.post(live_server.url + path, content=body, headers={"Content-Type": "application/json"},
                       timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and "nested too deep" in error["message"]
    assert live_server.client().completions.create(model="tiny-llama", prompt="hi", max_tokens=2).choices


def test_tools_count_their_properties_only_where_a_tool_choice_compiles_them():
    """An agent's 40 tools of 7 parameters (280 properties) under tool_choice auto or none constrain nothing, so no
    grammar is compiled and nothing is refused; a required call compiles them all, a named one only its own."""
    from inferplug.errors import RequestError
    from inferplug.server.limits import screen

    tools = [{"type": "function", "function": {"name": f"t{i}", "parameters": {"type": "object", "properties": {
        f"p{j}": {"type": "string"} for j in range(7)}}}} for i in range(40)]
    named = {"type": "function", "function": {"name": "t3"}}
    for choice in (None, "auto", "none", named):
        screen("/v1/chat/completions", {"messages": MESSAGES, "tools": tools, "tool_choice": choice}, ServerOptions(),
               None)
    with pytest.raises(RequestError, match="max_schema_properties"):
        screen("/v1/chat/completions", {"messages": MESSAGES, "tools": tools, "tool_choice": "required"},
               ServerOptions(), None)


def test_a_body_of_many_small_nested_lists_is_refused_before_it_is_parsed(server_factory, tiny_backend):
    """Under the comma bound but not the containers': 65,000 items of 5 nested lists each hold 65,000 commas and
    325,000 lists, which json.loads and the depth walk would take seconds over on the event loop."""
    server = server_factory(tiny_backend)
    item = b"[[[[[1]]]]]"
    body = b'{"model": "tiny-llama", "prompt": "hi", "user": [' + b",".join([item] * 65_000) + b"]}"
    reply = httpx.post(server.url + "/completions", content=body, headers={"Content-Type": "application/json"},
                       timeout=120)
    assert reply.status_code == 413 and reply.json()["error"]["code"] == "max_json_values"
