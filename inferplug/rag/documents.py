"""Retrieved documents, whatever framework they come from, as (text, content key).

A document's key is a hash of its text, so the same chunk retrieved by different
queries, next to different neighbours, has the same key and can hit the cache.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from inferplug.errors import RequestError


def document_key(text: str) -> str:
    """The content hash of a document's text (16 hex digits of sha256)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class RagDocument:
    text: str
    key: str

    @classmethod
    def of(cls, text: str) -> RagDocument:
        return cls(text=text, key=document_key(text))


def as_rag_document(doc: Any) -> RagDocument:
    """Accept a str, a RagDocument, a LangChain Document, or a LlamaIndex node / NodeWithScore.

    Duck-typed so neither framework is imported here.
    """
    if isinstance(doc, RagDocument):
        return doc
    if isinstance(doc, str):
        return RagDocument.of(doc)
    if hasattr(doc, "page_content"):  # langchain_core.documents.Document
        return RagDocument.of(doc.page_content)
    node = getattr(doc, "node", doc)  # NodeWithScore wraps a node
    if hasattr(node, "get_content"):  # llama_index TextNode / BaseNode
        return RagDocument.of(_llama_node_text(node))
    raise RequestError(
        f"cannot use a {type(doc).__name__} as a retrieved document: give a str, a LangChain Document "
        "or a LlamaIndex node",
        param="documents",
    )


def _llama_node_text(node: Any) -> str:
    """The text LlamaIndex's response synthesizer puts in the prompt (content with LLM metadata)."""
    try:
        from llama_index.core.schema import MetadataMode

        return node.get_content(metadata_mode=MetadataMode.LLM)
    except ImportError:  # pragma: no cover - a node implies llama_index is installed
        return node.get_content()


def canonical_order(docs: list[Any]) -> list[RagDocument]:
    """Deduplicated documents sorted by key: the same set of chunks always gives the same prompt text,
    whatever order the retriever returned them in, so plain prefix caching can hit too."""
    unique = {d.key: d for d in map(as_rag_document, docs)}
    return [unique[k] for k in sorted(unique)]
