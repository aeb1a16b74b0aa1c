"""Lay a RAG prompt out for KV reuse, and find its documents in the rendered prompt.

Layout: the stable system text first (an exact prefix, shared by every request),
then the documents in canonical order, one per block of text, then the question last.
The engine gets each document's character span and content key as a cache hint
(`Request.documents`), so a chunk's KV is found again next to other neighbours.
"""

from __future__ import annotations

from typing import Any

from inferplug.rag.documents import RagDocument, as_rag_document, canonical_order
from inferplug.types import DocumentSpan

DEFAULT_SYSTEM = (
    "You are a helpful assistant. Answer the question using only the context documents below. "
    "If they do not contain the answer, say you do not know."
)
DOCUMENT_SEPARATOR = "\n\n"


def format_documents(docs: list[Any]) -> str:
    """The documents' texts in canonical order, separated by blank lines (for a prompt's {context})."""
    return DOCUMENT_SEPARATOR.join(d.text for d in canonical_order(docs))


def rag_messages(question: str, docs: list[Any], system: str = DEFAULT_SYSTEM) -> list[dict[str, str]]:
    """Chat messages in the reuse-friendly layout: system text, then context, then the question."""
    context = format_documents(docs)
    return [
        {"role": "system", "content": f"{system}\n\nContext documents:\n\n{context}"},
        {"role": "user", "content": question},
    ]


def rag_prompt(question: str, docs: list[Any], system: str = DEFAULT_SYSTEM) -> str:
    """The same layout as one plain-text prompt, for completion models."""
    return f"{system}\n\nContext documents:\n\n{format_documents(docs)}\n\nQuestion: {question}\nAnswer:"


def document_spans(prompt_text: str, docs: list[Any]) -> list[DocumentSpan]:
    """Where each document's text occurs in the rendered prompt, in prompt order, non-overlapping.

    Documents not found verbatim (the template changed them) are skipped: a missed hint only
    costs a cache hit, never correctness.
    """
    spans: list[DocumentSpan] = []
    for doc in {d.key: d for d in map(as_rag_document, docs)}.values():
        start = prompt_text.find(doc.text) if doc.text.strip() else -1
        if start >= 0:
            spans.append(DocumentSpan(start=start, end=start + len(doc.text), key=doc.key))
    spans.sort(key=lambda s: s.start)
    kept: list[DocumentSpan] = []
    for span in spans:
        if not kept or span.start >= kept[-1].end:
            kept.append(span)
    return kept


class DocumentMemory:
    """The documents a front end has seen retrieved recently, bounded, newest last.

    Retrieval and generation are separate calls in LangChain and LlamaIndex, so the
    LLM remembers what was retrieved (through `format_documents` / a node postprocessor)
    and hints those texts with the prompt it is later asked to complete (the prompt stage finds them in it).
    """

    def __init__(self, capacity: int = 512) -> None:
        self.capacity = capacity
        self.docs: dict[str, RagDocument] = {}  # by key, the oldest first

    def remember(self, docs: list[Any]) -> list[RagDocument]:
        found = [as_rag_document(d) for d in docs]
        for doc in found:
            self.docs.pop(doc.key, None)
            self.docs[doc.key] = doc
        while len(self.docs) > self.capacity:
            self.docs.pop(next(iter(self.docs)))
        return found
