"""RAG-aware prompt layout and document cache keys."""

from inferplug.rag.documents import RagDocument, as_rag_document, canonical_order, document_key
from inferplug.rag.layout import (
    DEFAULT_SYSTEM,
    DocumentMemory,
    document_spans,
    format_documents,
    rag_messages,
    rag_prompt,
)

__all__ = [
    "DEFAULT_SYSTEM",
    "DocumentMemory",
    "RagDocument",
    "as_rag_document",
    "canonical_order",
    "document_key",
    "document_spans",
    "format_documents",
    "rag_messages",
    "rag_prompt",
]
