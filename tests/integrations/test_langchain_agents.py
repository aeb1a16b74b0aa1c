"""ChatInferPlug as LangChain v1 agents and users meet it: .profile, every knob, streaming, logprobs, agents."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

from inferplug.errors import RequestError

pytestmark = [pytest.mark.smollm2, pytest.mark.slow]


class Answer(BaseModel):
    city: str = Field(description="the city asked about", max_length=30)
    sunny: bool


@pytest.fixture(scope="module")
def chat():
    from langchain_inferplug import ChatInferPlug

    return ChatInferPlug(profile="smollm2-135m", temperature=0, max_tokens=40)


def test_profile_argument_names_ours_and_profile_is_langchains(chat):
    assert chat.inferplug_profile.name == "smollm2-135m"
    assert chat.profile["tool_calling"] and chat.profile["structured_output"]
    assert chat.profile["max_input_tokens"] == chat.backend.context_length


def test_unknown_argument_is_an_error_naming_the_valid_ones():
    from langchain_inferplug import ChatInferPlug, InferPlugLLM

    for cls in (ChatInferPlug, InferPlugLLM):
        with pytest.raises(RequestError, match=r"unknown argument\(s\) \['topk'\].*'top_k'"):
            cls(profile="smollm2-135m", topk=40)


def test_every_knob_reaches_the_request(chat):
    from langchain_core.messages import HumanMessage

    tuned = chat.model_copy(update=dict(top_k=40, min_p=0.05, repetition_penalty=1.1, presence_penalty=0.2,
                                        frequency_penalty=0.3, seed=7, top_p=0.9, stop=["x"], logprobs=True,
                                        top_logprobs=3))
    p = tuned._prepare([HumanMessage("hi")], ["y"], {"top_k": 20}).request.params
    assert (p.top_k, p.min_p, p.repetition_penalty, p.presence_penalty, p.frequency_penalty, p.seed, p.top_p,
            p.logprobs) == (20, 0.05, 1.1, 0.2, 0.3, 7, 0.9, 3)
    assert p.stop == ["x", "y"]
    assert tuned._identifying_params != chat._identifying_params  # an LLM cache keeps them apart


def test_invoke_streams_tokens_to_handlers_and_logprobs_come_back(chat):
    from langchain_core.callbacks import BaseCallbackHandler

    class Tokens(BaseCallbackHandler):
        def __init__(self):
            self.tokens = []

        def on_llm_new_token(self, token, **kwargs):
            self.tokens.append(token)

    handler = Tokens()
    message = chat.invoke("Say hello.", config={"callbacks": [handler]}, logprobs=True, top_logprobs=2)
    assert len(handler.tokens) > 3 and "".join(handler.tokens) == message.content
    entries = message.response_metadata["logprobs"]["content"]
    assert len(entries) == message.usage_metadata["output_tokens"]  # the closing EOS token's too
    assert all(len(e["top_logprobs"]) == 2 and e["logprob"] <= 0 for e in entries)


def test_tool_call_chunks_stream_while_tools_are_bound(chat):
    bound = chat.bind_tools([Answer], tool_choice="Answer")
    chunks = list(bound.stream("Is it sunny in Paris?"))
    with_args = [c for c in chunks if any(t["args"] for t in c.tool_call_chunks)]
    assert len(with_args) > 3  # the arguments arrive as they are decoded
    merged = chunks[0]
    for c in chunks[1:]:
        merged += c
    whole = bound.invoke("Is it sunny in Paris?")
    assert [(c["name"], c["args"]) for c in merged.tool_calls] == [(c["name"], c["args"]) for c in whole.tool_calls]
    assert merged.response_metadata["finish_reason"] == "tool_calls"


async def test_astream_events_shows_tokens(chat):
    streamed = [e async for e in chat.astream_events("Say hello.", version="v2") if e["event"] == "on_chat_model_stream"]
    assert len(streamed) > 3


def test_json_mode_without_a_schema(chat):
    assert isinstance(chat.with_structured_output(method="json_mode").invoke("A JSON object about Paris."), dict)


def test_create_agent_response_format_uses_the_json_schema_constraint(chat):
    from langchain.agents import create_agent

    agent = create_agent(chat, tools=[], response_format=Answer)
    state = agent.invoke({"messages": [{"role": "user", "content": "Is it sunny in Paris today?"}]})
    assert isinstance(state["structured_response"], Answer)


def test_create_agent_tool_loop_with_a_forced_first_call(chat):
    """SmolLM2-135M does not choose a tool by itself: a middleware forces the first call, the loop runs on."""
    from langchain.agents import create_agent
    from langchain.agents.middleware import wrap_model_call
    from langchain_core.messages import ToolMessage
    from langchain_core.tools import tool

    calls = []

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"It is sunny in {city}."

    @wrap_model_call
    def first_call_forced(request, handler):
        if not any(isinstance(m, ToolMessage) for m in request.messages):
            request = request.override(tool_choice="any")
        return handler(request)

    agent = create_agent(chat, tools=[get_weather], middleware=[first_call_forced])
    state = agent.invoke({"messages": [{"role": "user", "content": "What is the weather in Paris?"}]},
                         {"recursion_limit": 12})
    assert len(calls) >= 1 and any(isinstance(m, ToolMessage) for m in state["messages"])
    assert state["messages"][-1].type == "ai"


def test_response_format_on_a_backend_that_cannot_constrain(tiny_llama_dir):
    from langchain_inferplug import ChatInferPlug
    from tests.server.conftest import tiny_ct2_profile

    profile = tiny_ct2_profile(tiny_llama_dir)
    model = ChatInferPlug(profile=profile)
    assert model.profile["structured_output"] is False  # so create_agent picks a tool strategy
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": Answer.model_json_schema()}}
    with pytest.raises(RequestError, match="response_format needs constrained decoding"):
        model.invoke("hi", response_format=fmt)
