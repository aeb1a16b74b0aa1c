"""A required or named tool choice cut by max_tokens, through LangChain and LlamaIndex on the tiny native model: the
answer is the call still, as ChatOpenAI and LlamaIndex's OpenAI LLM read OpenAI's (finish_reason "length", the
partial text as the arguments), never content. The reference is the engine's own text for the same request."""

from __future__ import annotations

import pytest

from inferplug.frontend.requests import build_request
from tests.server.test_tools import ADD, ASK, WEATHER

HEAD = '{"name": "weather", "arguments": '
CUT_IN_ARGUMENTS = 48  # tokens: the tiny model's call is cut after '{"city": "Rome",'


@pytest.fixture(scope="module")
def native(tiny_profile):
    from inferplug.backends.registry import get_backend

    return get_backend(tiny_profile)


def engine_arguments(native, tools, choice, max_tokens: int) -> str:
    """The arguments text the engine generates for ASK with these tools and tool choice, cut at max_tokens."""
    prepared = build_request(native, messages=ASK, tools=tools, tool_choice=choice,
                             options={"temperature": 0, "max_tokens": max_tokens})
    text = "".join(e.text for e in native.generate_sync(prepared.request))
    assert text.startswith(HEAD) and not text.endswith("}")
    return text[len(HEAD):]


@pytest.mark.parametrize("choice", ["weather", {"type": "function", "function": {"name": "weather"}}])
def test_langchain_gets_the_cut_call_as_chat_openai_does(native, tiny_profile, choice):
    from langchain_inferplug import ChatInferPlug

    partial = engine_arguments(native, [WEATHER, ADD], choice, CUT_IN_ARGUMENTS)
    bound = ChatInferPlug(profile=tiny_profile, temperature=0, max_tokens=CUT_IN_ARGUMENTS).bind_tools(
        [WEATHER, ADD], tool_choice=choice)
    whole = bound.invoke(ASK[0]["content"])
    assert whole.content == "" and whole.tool_calls == [] and whole.response_metadata["finish_reason"] == "length"
    [cut] = whole.invalid_tool_calls  # arguments that are no JSON yet: ChatOpenAI's invalid tool call
    assert (cut["name"], cut["args"]) == ("weather", partial) and cut["id"].startswith("call_")

    chunks = list(bound.stream(ASK[0]["content"]))
    merged = sum(chunks[1:], chunks[0])
    assert merged.content == "" and merged.response_metadata["finish_reason"] == "length"
    assert "".join(c["args"] or "" for c in merged.tool_call_chunks) == partial
    [call] = merged.tool_calls  # LangChain reads streamed arguments as partial JSON, as it does ChatOpenAI's
    assert call["name"] == "weather" and call["args"] == {"city": "Rome"}


def test_llamaindex_gets_the_cut_call_as_its_openai_llm_does(native, tiny_profile):
    from llama_index.core.base.llms.types import ChatMessage
    from llama_index.llms.inferplug import InferPlug

    partial = engine_arguments(native, [WEATHER], "required", CUT_IN_ARGUMENTS)
    llm = InferPlug(profile=tiny_profile, temperature=0, max_tokens=CUT_IN_ARGUMENTS)
    asked = [ChatMessage(role="user", content=ASK[0]["content"])]
    for response in (llm.chat(asked, tools=[WEATHER], tool_choice="required"),
                     list(llm.stream_chat(asked, tools=[WEATHER], tool_choice="required"))[-1]):
        [raw] = response.message.additional_kwargs["tool_calls"]
        assert (raw["function"]["name"], raw["function"]["arguments"]) == ("weather", partial)
        assert response.raw["finish_reason"] == "length"
        [selection] = llm.get_tool_calls_from_response(response)
        assert (selection.tool_name, selection.tool_kwargs) == ("weather", {"city": "Rome"})
