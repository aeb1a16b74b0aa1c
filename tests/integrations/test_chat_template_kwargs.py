"""chat_template_kwargs (vLLM's name: Qwen3's {"enable_thinking": False}) reach the chat template from every front
end: LangChain (the model's field or a call's keyword), LlamaIndex, the server (the official openai client's
extra_body) and the offline LLM; the request carries them, and the rendered prompt shows them. A variable the
request already gives (tools, messages, ...) is refused by name."""

from __future__ import annotations

import dataclasses

import pytest

from inferplug.errors import RequestError

# Qwen3's switch: thinking is on unless enable_thinking is false, when the assistant turn opens with an empty block
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\\n{{ m['content'] }}<|im_end|>\\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\\n{% if enable_thinking is defined and "
            "enable_thinking is false %}<think>\\n\\n</think>\\n\\n{% endif %}{% endif %}")
OFF = {"enable_thinking": False}
EMPTY_THINK = "<think>\n\n</think>\n\n"


@pytest.fixture(scope="module")
def thinking_profile(tiny_llama_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("profiles") / "thinking.toml"
    path.write_text(f'name = "thinking"\nbackend = "native"\ndtype = "float32"\n[model]\npath = "{tiny_llama_dir}"\n'
                    f'served_name = "thinking"\nchat_template = "{TEMPLATE}"\n')
    yield str(path)
    from inferplug.backends.registry import close_backend

    close_backend(str(path))


@pytest.fixture
def rendered(monkeypatch):
    """The prompt text of every request the native engine encodes, with the request's template variables."""
    from inferplug.backends import async_engine
    from inferplug.engine import llm_engine
    from inferplug.stages.prompt import encode_prompt

    texts = []

    def spy(tokenizer, render, request, context_length):
        encoded = encode_prompt(tokenizer, render, request, context_length)
        texts.append((request.chat_template_kwargs, encoded.text))
        return encoded

    for module in (async_engine, llm_engine):  # the step thread's prompt workers, and the engine's own encode
        monkeypatch.setattr(module, "encode_prompt", spy)
    return texts


def _check(rendered, expected_kwargs):
    kwargs, text = rendered[-1]
    assert kwargs == expected_kwargs
    assert text.endswith(EMPTY_THINK) == (expected_kwargs == OFF), text


def test_langchain_field_and_call_keyword(thinking_profile, rendered):
    from langchain_core.messages import HumanMessage

    from langchain_inferplug import ChatInferPlug

    llm = ChatInferPlug(profile=thinking_profile, temperature=0, max_tokens=2)
    llm.invoke([HumanMessage("hi")])
    _check(rendered, None)
    llm.invoke([HumanMessage("hi")], chat_template_kwargs=OFF)
    _check(rendered, OFF)
    ChatInferPlug(profile=thinking_profile, temperature=0, max_tokens=2, chat_template_kwargs=OFF).invoke("hi")
    _check(rendered, OFF)


def test_llamaindex(thinking_profile, rendered):
    from llama_index.core.base.llms.types import ChatMessage

    from llama_index.llms.inferplug import InferPlug

    InferPlug(profile=thinking_profile, temperature=0.0, max_tokens=2, chat_template_kwargs=OFF).chat(
        [ChatMessage(role="user", content="hi")])
    _check(rendered, OFF)


def test_server_through_the_openai_client(thinking_profile, rendered):
    from inferplug.backends.registry import get_backend
    from tests.server.conftest import start_server

    server = start_server(get_backend(thinking_profile))
    try:
        client = server.client()
        answer = client.chat.completions.create(model="thinking", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=2, temperature=0, extra_body={"chat_template_kwargs": OFF})
        _check(rendered, OFF)
        plain = client.chat.completions.create(model="thinking", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=2, temperature=0)
        _check(rendered, None)
        thinking_tokens = len(get_backend(thinking_profile).tokenizer.encode(EMPTY_THINK, add_special_tokens=False))
        assert answer.usage.prompt_tokens == plain.usage.prompt_tokens + thinking_tokens
    finally:
        server.stop()


def test_a_variable_the_request_gives_itself_is_refused(thinking_profile):
    from inferplug.backends.registry import get_backend
    from inferplug.frontend.requests import build_request

    backend = get_backend(thinking_profile)
    prepared = build_request(backend, messages=[{"role": "user", "content": "hi"}], options={"max_tokens": 2},
                             chat_template_kwargs={"tools": []})
    assert dataclasses.asdict(prepared.request)["chat_template_kwargs"] == {"tools": []}
    from inferplug.stages.prompt import prompt_token_ids

    with pytest.raises(RequestError, match=r"chat_template_kwargs may not set \['tools'\]"):
        prompt_token_ids(backend, prepared.request)


def test_reasoning_effort_from_every_front_end(thinking_profile, rendered):
    """OpenAI's reasoning_effort (gpt-oss's template reads it as a variable) from LangChain, LlamaIndex and the
    official openai client's own parameter; chat_template_kwargs win over it."""
    from langchain_core.messages import HumanMessage
    from llama_index.core.base.llms.types import ChatMessage

    from inferplug.backends.registry import get_backend
    from langchain_inferplug import ChatInferPlug
    from llama_index.llms.inferplug import InferPlug
    from tests.server.conftest import start_server

    HIGH = {"reasoning_effort": "high"}
    ChatInferPlug(profile=thinking_profile, temperature=0, max_tokens=2, reasoning_effort="high").invoke("hi")
    assert rendered[-1][0] == HIGH
    ChatInferPlug(profile=thinking_profile, temperature=0, max_tokens=2).invoke([HumanMessage("hi")],
                                                                               reasoning_effort="low")
    assert rendered[-1][0] == {"reasoning_effort": "low"}
    InferPlug(profile=thinking_profile, temperature=0.0, max_tokens=2, reasoning_effort="high",
              chat_template_kwargs=OFF).chat([ChatMessage(role="user", content="hi")])
    assert rendered[-1][0] == HIGH | OFF
    server = start_server(get_backend(thinking_profile))
    try:
        server.client().chat.completions.create(model="thinking", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=2, temperature=0, reasoning_effort="high")
        assert rendered[-1][0] == HIGH
    finally:
        server.stop()
