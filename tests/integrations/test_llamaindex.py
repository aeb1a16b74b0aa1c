"""The LlamaIndex LLM on the real SmolLM2 model: metadata, chat/complete (sync, async, streaming), tools, RAG."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

from inferplug.errors import RequestError

pytestmark = [pytest.mark.smollm2, pytest.mark.slow]


class City(BaseModel):
    name: str = Field(max_length=30)
    country: str = Field(max_length=30)


@pytest.fixture(scope="module")
def llm():
    from llama_index.llms.inferplug import InferPlug

    return InferPlug(profile="smollm2-135m", temperature=0, max_tokens=24)


def test_metadata_comes_from_the_model(llm):
    meta = llm.metadata
    assert meta.context_window == llm.backend.context_length > 2048
    assert meta.num_output == 24 and meta.is_chat_model and meta.is_function_calling_model
    assert meta.model_name == "smollm2-135m"


def test_complete_chat_and_streams(llm):
    from llama_index.core.base.llms.types import ChatMessage

    done = llm.complete("What is the capital of France?")
    assert "Paris" in done.text and done.raw["usage"]["completion_tokens"] > 0
    deltas = [r.delta for r in llm.stream_complete("What is the capital of France?")]
    assert "".join(d or "" for d in deltas) == done.text
    reply = llm.chat([ChatMessage(role="user", content="Say hello.")])
    assert reply.message.content and reply.raw["usage"]["prompt_tokens"] > 0


async def test_async_forms(llm):
    from llama_index.core.base.llms.types import ChatMessage

    done = await llm.acomplete("The capital of France is")
    stream = await llm.astream_chat([ChatMessage(role="user", content="The capital of France is")])
    last = None
    async for last in stream:
        pass
    assert done.text and last.message.content and last.raw["usage"]["completion_tokens"] > 0


def test_required_tool_call_is_well_formed(llm):
    from llama_index.core.tools import FunctionTool

    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return "sunny"

    tool = FunctionTool.from_defaults(fn=get_weather)
    response = llm.chat_with_tools([tool], user_msg="What is the weather in Paris?", tool_required=True)
    calls = llm.get_tool_calls_from_response(response)
    assert [c.tool_name for c in calls] == ["get_weather"] and isinstance(calls[0].tool_kwargs["city"], str)
    assert response.message.content == ""  # the call's text is no prose
    # streamed as the call so far, never as content (as LlamaIndex's OpenAI LLM streams one): its arguments grow
    # delta by delta, under one id, up to the whole call's
    streamed = list(llm.stream_chat_with_tools([tool], user_msg="What is the weather in Paris?", tool_required=True))
    so_far = [r.message.additional_kwargs["tool_calls"] for r in streamed if r.message.additional_kwargs]
    assert all(r.message.content == "" for r in streamed) and len(so_far) > 2
    assert {c["id"] for [c] in so_far} == {so_far[-1][0]["id"]} and {c["function"]["name"] for [c] in so_far} == {
        "get_weather"}
    arguments = [c["function"]["arguments"] for [c] in so_far]
    assert all(later.startswith(earlier) for earlier, later in zip(arguments[:-2], arguments[1:-1]))
    assert llm.get_tool_calls_from_response(streamed[-1])[0].tool_kwargs == calls[0].tool_kwargs


def test_image_content_is_a_clear_error(llm):
    from llama_index.core.base.llms.types import ChatMessage, ImageBlock

    with pytest.raises(RequestError, match="text only"):
        llm.chat([ChatMessage(role="user", blocks=[ImageBlock(url="http://example.com/cat.png")])])


def test_streaming_query_engine_offline_with_document_cache(llm):
    from inferplug.commands.demo import build_query_engine

    engine, demo_llm, _ = build_query_engine("smollm2-135m", top_k=3, max_tokens=16)
    assert demo_llm.backend.plan.rag_document_cache and not llm.backend.plan.rag_document_cache  # the demo opts in
    before = demo_llm.backend.stats()["doc_cache_stored"]
    text = "".join(engine.query("What does the RAG-aware cache do?").response_gen)
    assert text.strip()
    assert demo_llm.backend.stats()["doc_cache_stored"] > before


def test_additional_kwargs_fields_and_per_call_overrides_reach_the_request(llm):
    from llama_index.core.llms import ChatMessage

    tuned = llm.model_copy(update=dict(additional_kwargs={"temperature": 0.5, "max_tokens": 20, "stop": ["zz"],
                                                          "top_k": 5, "repetition_penalty": 1.1},
                                       context_window=1000, num_output=50))
    p = tuned._prepare([ChatMessage(role="user", content="hi")], {"temperature": 0.3, "top_p": 0.9,
                                                                   "stop": ["yy"]}).request.params
    # per call > the temperature/max_tokens fields > additional_kwargs > the profile
    assert (p.temperature, p.top_p, p.top_k, p.repetition_penalty, p.stop) == (0.3, 0.9, 5, 1.1, ["zz", "yy"])
    assert p.max_tokens == (llm.max_tokens or 20)
    assert (tuned.metadata.context_window, tuned.metadata.num_output) == (1000, 50)


def test_structured_predict_uses_the_json_schema_constraint(llm):
    from llama_index.core.prompts import PromptTemplate

    city = llm.structured_predict(City, PromptTemplate("Name a city in {place}."), place="France")
    assert isinstance(city, City) and city.name


def test_logprobs_on_the_chat_response(llm):
    from llama_index.core.llms import ChatMessage

    response = llm.chat([ChatMessage(role="user", content="Say hi")], logprobs=2, max_tokens=8)
    assert len(response.logprobs) == response.raw["usage"]["completion_tokens"]
    assert all(len(top) == 2 for top in response.logprobs)


def test_parallel_tool_calls_only_when_allowed(llm):
    from llama_index.core.llms import ChatMessage, ChatResponse

    calls = [{"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in range(2)]

    def response():
        return ChatResponse(message=ChatMessage(role="assistant", content="", additional_kwargs={"tool_calls": calls}))

    assert len(llm._validate_chat_with_tools_response(response(), [], allow_parallel_tool_calls=True)
               .message.additional_kwargs["tool_calls"]) == 2
    assert len(llm._validate_chat_with_tools_response(response(), []).message.additional_kwargs["tool_calls"]) == 1


def test_a_structured_reply_cut_by_max_tokens_says_so(llm):
    from llama_index.core.prompts import PromptTemplate

    prompt = PromptTemplate("Name a city in {place}.")
    with pytest.raises(ValueError, match="reached max_tokens before its JSON was complete.*raise max_tokens for City"):
        llm.structured_predict(City, prompt, llm_kwargs={"max_tokens": 3}, place="France")
    with pytest.raises(ValueError, match="reached max_tokens"):
        list(llm.stream_structured_predict(City, prompt, llm_kwargs={"max_tokens": 3}, place="France"))
    assert llm.backend.stats()["kv_blocks_used"] == 0


def test_stream_structured_predict_streams_partials_under_the_constraint(llm):
    from llama_index.core.program.utils import FlexibleModel
    from llama_index.core.prompts import PromptTemplate

    prompt = PromptTemplate("Name a city in {place}.")
    whole = llm.structured_predict(City, prompt, place="France")
    streamed = list(llm.stream_structured_predict(City, prompt, place="France"))
    # partial objects while the JSON grows (LlamaIndex's Flexible model until the fields validate), then the
    # whole object: the same as the call that did not stream
    assert len(streamed) > 2 and all(isinstance(p, (FlexibleModel, City)) for p in streamed)
    assert isinstance(streamed[0], FlexibleModel) and streamed[0].name is None
    assert isinstance(streamed[-1], City) and streamed[-1] == whole == streamed[-2]


async def test_astream_structured_predict(llm):
    from llama_index.core.prompts import PromptTemplate

    prompt, room = PromptTemplate("Name a city in {place}."), {"max_tokens": 64}  # the fixture's 24 can cut the JSON
    streamed = [p async for p in await llm.astream_structured_predict(City, prompt, llm_kwargs=room, place="Italy")]
    assert streamed[-1] == await llm.astructured_predict(City, prompt, llm_kwargs=room, place="Italy")
    stats = llm.backend.stats()
    assert stats["kv_blocks_used"] == 0
