"""Message conversion: every LangChain/LlamaIndex message the templates can render, a clear error otherwise."""

from __future__ import annotations

import pytest

from inferplug.errors import RequestError


def test_langchain_history_with_tool_calls():
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    from langchain_inferplug.messages import chat_dict

    history = [chat_dict(m) for m in [
        SystemMessage("Be brief."), HumanMessage("Weather in Paris?"),
        AIMessage("", tool_calls=[{"name": "get_weather", "args": {"city": "Paris"}, "id": "c1"}]),
        ToolMessage("sunny", tool_call_id="c1"),
    ]]
    assert [m["role"] for m in history] == ["system", "user", "assistant", "tool"]
    assert history[2]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert "get_weather" in history[2]["content"] and history[3]["tool_call_id"] == "c1"


def test_langchain_unrenderable_content_is_a_clear_error():
    from langchain_core.messages import ChatMessage, HumanMessage

    from langchain_inferplug.messages import chat_dict

    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    with pytest.raises(RequestError, match="cannot render a 'image_url' content block"):
        chat_dict(HumanMessage(content=[{"type": "text", "text": "what is this"}, image]))
    with pytest.raises(RequestError, match="role 'critic'"):
        chat_dict(ChatMessage(role="critic", content="hm"))


def test_llamaindex_messages():
    from llama_index.core.base.llms.types import ChatMessage, ImageBlock, MessageRole

    from llama_index.llms.inferplug.messages import to_chat_dicts

    out = to_chat_dicts([ChatMessage(role=MessageRole.USER, content="hi"),
                         ChatMessage(role=MessageRole.TOOL, content="42", additional_kwargs={"tool_call_id": "c"})])
    assert out == [{"role": "user", "content": "hi"}, {"role": "tool", "content": "42", "tool_call_id": "c"}]
    with pytest.raises(RequestError, match="cannot render a ImageBlock"):
        to_chat_dicts([ChatMessage(role=MessageRole.USER, blocks=[ImageBlock(url="http://x/y.png")])])
