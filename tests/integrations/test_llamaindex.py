"""The LlamaIndex LLM on the real SmolLM2 model: metadata, chat/complete (sync, async, streaming), tools, RAG."""

from __future__ import annotations

import pytest

from inferplug.errors import RequestError

pytestmark = [pytest.mark.smollm2, pytest.mark.slow]


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
    # streamed: the text grows delta by delta; the calls are parsed once, into the last response
    streamed = list(llm.stream_chat_with_tools([tool], user_msg="What is the weather in Paris?", tool_required=True))
    final = streamed[-1].message.content
    assert all(final.startswith(r.message.content) for r in streamed) and len(streamed) > 2
    assert [c.tool_name for c in llm.get_tool_calls_from_response(streamed[-1])] == ["get_weather"]


def test_image_content_is_a_clear_error(llm):
    from llama_index.core.base.llms.types import ChatMessage, ImageBlock

    with pytest.raises(RequestError, match="text only"):
        llm.chat([ChatMessage(role="user", blocks=[ImageBlock(url="http://example.com/cat.png")])])


def test_streaming_query_engine_offline_with_document_cache(llm):
    from inferplug.commands.demo import build_query_engine

    engine, demo_llm, _ = build_query_engine("smollm2-135m", top_k=3, max_tokens=16)
    assert demo_llm.backend is llm.backend
    before = llm.backend.stats()["doc_cache_stored"]
    text = "".join(engine.query("What does the RAG-aware cache do?").response_gen)
    assert text.strip()
    assert llm.backend.stats()["doc_cache_stored"] > before
