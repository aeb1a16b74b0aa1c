"""The LlamaIndex LLM on a base model (the real Gemma 3 270M, whose file has no chat template): it is not a chat
model, and a completion sends the prompt as it is, as LlamaIndex's own llama.cpp and vLLM classes do."""

from __future__ import annotations

import asyncio

import pytest

from inferplug.types import Request, SamplingParams

pytestmark = pytest.mark.gemma3_270m


def test_a_base_model_completes_the_prompt_as_it_is(gemma3_270m_gguf):
    from llama_index.llms.inferplug import InferPlug

    llm = InferPlug(profile=str(gemma3_270m_gguf), temperature=0, max_tokens=8)
    assert not llm.metadata.is_chat_model
    prompt = "The capital of France is"
    direct = "".join(e.text for e in llm.backend.generate_sync(
        Request(prompt=prompt, params=SamplingParams(temperature=0, max_tokens=8))))
    assert llm.complete(prompt).text == direct
    assert "".join(r.delta for r in llm.stream_complete(prompt)) == direct
    assert asyncio.run(llm.acomplete(prompt)).text == direct
