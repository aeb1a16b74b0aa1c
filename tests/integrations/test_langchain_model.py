"""ChatInferPlug/InferPlugLLM on the real SmolLM2 model: what the standard suite does not cover."""

from __future__ import annotations

import pytest

from inferplug.errors import ProfileError, RequestError

pytestmark = [pytest.mark.smollm2, pytest.mark.slow]

DOCS = ["The Grand forge of Arden was founded in 1702 by Ada Holt and makes iron hinges.",
        "Blue whales sing long songs that travel across whole oceans at night.",
        "The observatory of Eskar keeps star charts that sailors buy every Friday."]


@pytest.fixture(scope="module")
def chat():
    from langchain_inferplug import ChatInferPlug

    return ChatInferPlug(profile="smollm2-135m", temperature=0, max_tokens=24)


def test_bad_profile_fails_at_construction():
    from langchain_inferplug import ChatInferPlug

    with pytest.raises(ProfileError):
        ChatInferPlug(profile="no-such-profile")


def test_constructor_and_call_stops_are_both_honoured(chat):
    free = chat.invoke("Count from 1 to 10, separated by commas.").content
    assert "4" in free
    with_stop = chat.model_copy(update={"stop": ["4"]}).invoke("Count from 1 to 10, separated by commas.")
    assert "4" not in with_stop.content and with_stop.content == free[: free.index("4")]
    assert "3" not in chat.invoke("Count from 1 to 10, separated by commas.", stop=["3"]).content


def test_uncompilable_tool_schema_is_a_clear_error_at_the_call(chat):
    bad = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "no-such-type"}}}}}
    with pytest.raises(RequestError, match="cannot be compiled"):
        chat.bind_tools([bad], tool_choice="f").invoke("call f")


def test_documents_hit_the_cache_next_to_new_neighbours():
    """With the document cache on (an opt-in), format_documents remembers the chunks; a later prompt holding one
    of them reuses its KV."""
    from langchain_core.documents import Document
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_inferplug import ChatInferPlug

    from inferplug.profile import load_profile, with_tables

    chat = ChatInferPlug(profile=with_tables(load_profile("smollm2-135m"), cache={"rag_document_cache": True}),
                         temperature=0, max_tokens=24)

    prompt = ChatPromptTemplate.from_messages([("system", "Answer from the context.\n\n{context}"), ("human", "{q}")])
    chain = prompt | chat
    first = chain.invoke({"context": chat.format_documents([Document(page_content=d) for d in DOCS[:2]]),
                          "q": "Who founded the forge?"})
    second = chain.invoke({"context": chat.format_documents([Document(page_content=d) for d in (DOCS[2], DOCS[1])]),
                           "q": "What do sailors buy?"})
    assert first.usage_metadata["input_token_details"]["cache_read"] < second.usage_metadata[
        "input_token_details"]["cache_read"]
    assert chat.backend.stats()["doc_cache_hit_tokens"] > 0


def test_llm_generate_submits_all_prompts(chat):
    from langchain_inferplug import InferPlugLLM

    llm = InferPlugLLM(profile="smollm2-135m", temperature=0, max_tokens=8)
    assert llm.backend is chat.backend  # one engine per profile per process
    result = llm.generate(["The capital of France is", "One, two, three,"])
    assert len(result.generations) == 2 and all(g[0].text for g in result.generations)
    assert result.generations[0][0].generation_info["finish_reason"] in ("stop", "length")
