"""RAG prompt layout: canonical order, document recognition from each framework, spans."""

from __future__ import annotations

import pytest

from inferplug.errors import RequestError
from inferplug.rag import (
    DocumentMemory,
    as_rag_document,
    canonical_order,
    document_key,
    document_spans,
    rag_messages,
    rag_prompt,
)

DOCS = ["Paris is the capital of France.", "The Seine flows through Paris.", "Lyon is known for food."]


def test_same_documents_in_any_order_give_the_same_prompt():
    a = rag_prompt("Where is Paris?", DOCS)
    b = rag_prompt("Where is Paris?", list(reversed(DOCS)) + [DOCS[0]])
    assert a == b
    assert a.index("Context") < min(a.index(d) for d in DOCS) and a.endswith("Answer:")
    assert a.rstrip().rfind("Where is Paris?") > max(a.index(d) for d in DOCS)


def test_langchain_and_llamaindex_documents_are_recognised():
    from langchain_core.documents import Document
    from llama_index.core.schema import NodeWithScore, TextNode

    lc = as_rag_document(Document(page_content=DOCS[0], metadata={"source": "x"}))
    li = as_rag_document(NodeWithScore(node=TextNode(text=DOCS[0]), score=0.3))
    assert lc.key == li.key == document_key(DOCS[0])
    with pytest.raises(RequestError, match="cannot use a int"):
        as_rag_document(3)


def test_spans_point_at_each_document_in_the_rendered_prompt():
    text = rag_messages("Where?", DOCS)[0]["content"]
    spans = document_spans(text, DOCS + ["never in the prompt"])
    assert [text[s.start : s.end] for s in spans] == [d.text for d in canonical_order(DOCS)]
    assert [s.key for s in spans] == [d.key for d in canonical_order(DOCS)]


def test_document_memory_is_bounded_and_finds_remembered_texts():
    memory = DocumentMemory(capacity=2)
    memory.remember(DOCS)
    assert len(memory.docs) == 2
    spans = document_spans(rag_prompt("q", DOCS), list(memory.docs.values()))
    assert {s.key for s in spans} == {document_key(DOCS[1]), document_key(DOCS[2])}
