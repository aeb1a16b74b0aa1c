"""An ingestion transform that precomputes each node's KV as it passes: an indexing step (TurboRAG)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.schema import BaseNode, TransformComponent
from pydantic import ConfigDict

from inferplug.frontend.precompute import precompute_documents


class DocumentKVPrecompute(TransformComponent):
    """`IngestionPipeline(transformations=[SentenceSplitter(), ..., llm.precompute_transform(), embed_model])`.

    The nodes come back unchanged, their KV computed and stored (in memory and, with a [cache] rag_disk_size, on
    disk), as the text a response synthesizer puts in the prompt (content with LLM metadata): place it after the
    transforms that change that text. salt: the salt the corpus is served under (None: the profile's
    rag_shared_salt)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    llm: Any
    salt: str | None = None

    @classmethod
    def class_name(cls) -> str:
        return "InferPlugDocumentKVPrecompute"

    def __call__(self, nodes: Sequence[BaseNode], **kwargs: Any) -> Sequence[BaseNode]:
        precompute_documents(self.llm.backend, list(nodes), self.salt)
        return nodes
