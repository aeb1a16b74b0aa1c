"""A document transformer that precomputes each Document's KV as it passes: an indexing step (TurboRAG)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.documents import BaseDocumentTransformer, Document


class DocumentKVPrecompute(BaseDocumentTransformer):
    """`DocumentKVPrecompute(llm).transform_documents(splitter.split_documents(docs))`, then add them to the vector
    store: the Documents come back unchanged, their KV computed and stored (llm.precompute_documents)."""

    def __init__(self, llm: Any, salt: str | None = None) -> None:
        self.llm, self.salt = llm, salt

    def transform_documents(self, documents: Sequence[Document], **kwargs: Any) -> Sequence[Document]:
        self.llm.precompute_documents(list(documents), self.salt)
        return documents
