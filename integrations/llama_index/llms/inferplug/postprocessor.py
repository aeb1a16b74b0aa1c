"""A node postprocessor that lays retrieved nodes out for KV reuse and tells the LLM about them."""

from __future__ import annotations

from typing import Any

from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import NodeWithScore, QueryBundle
from pydantic import ConfigDict

from inferplug.rag.documents import as_rag_document


class DocumentCacheHints(BaseNodePostprocessor):
    """`index.as_query_engine(llm=llm, node_postprocessors=[llm.document_hints()])`.

    Sorts the retrieved nodes into canonical order (the same set always gives the same
    context text) and remembers their texts, so the LLM finds each document in the prompt
    and passes its span to the engine, which caches and finds its KV per document.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)
    memory: Any

    @classmethod
    def class_name(cls) -> str:
        return "InferPlugDocumentCacheHints"

    def _postprocess_nodes(self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
                           ) -> list[NodeWithScore]:
        keyed = sorted(((as_rag_document(n).key, n) for n in nodes), key=lambda kn: kn[0])
        self.memory.remember([n for _, n in keyed])
        return [n for _, n in keyed]
