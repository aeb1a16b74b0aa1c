"""Document KV at indexing time, over the Backend protocol: what the integrations' precompute helpers run.

Each document becomes one precompute request (rag/precompute.py), sent only where the chat template keeps the document
verbatim (it has a span to store); a batch of them is submitted at once.
"""

from __future__ import annotations

import warnings
from typing import Any

from inferplug.chat_template import chat_template_text
from inferplug.frontend.calls import generate_all
from inferplug.frontend.requests import UncachedDocumentsWarning, no_document_cache_why
from inferplug.rag.precompute import precompute_request
from inferplug.stages.prompt import document_hints
from inferplug.types import Request

BATCH = 64  # requests in flight at once: a large corpus is not queued whole


def precompute_documents(backend: Any, docs: list[Any], salt: str | None = None, *, chat: bool = True) -> int:
    """Compute and store each document's KV (a str, LangChain Document or LlamaIndex node) on `backend` under `salt`:
    the salt the corpus is served under (a tenant's, for its private corpus); None: the profile's
    [cache] rag_shared_salt. chat: the queries go through the chat template (False: plain prompts). Returns the
    documents computed: one the chat template does not keep verbatim has no span to store, so it is not run (as
    LLM.precompute_documents); 0, with a warning, on a backend without a document cache."""
    if not backend.capabilities.rag_cache:
        warnings.warn(f"nothing is precomputed: {no_document_cache_why(backend)}", UncachedDocumentsWarning,
                      stacklevel=2)
        return 0
    salt = salt if salt is not None else backend.profile.cache.rag_shared_salt
    chat = chat and backend.tokenizer is not None and chat_template_text(backend.profile, backend.tokenizer) is not None
    requests = [r for r in (precompute_request(d, salt, chat) for d in docs) if _placed(backend, r)]
    for start in range(0, len(requests), BATCH):
        generate_all(backend, requests[start:start + BATCH])  # raises what a failed request raised
    return len(requests)


def _placed(backend: Any, request: Request) -> bool:
    """Whether the rendered request keeps its document verbatim (the prompt stage then places it in its own text).
    Over the Backend protocol the prompt stage's result does not come back, so the chat is rendered here to know, and
    again by the prompt stage: twice a document, at indexing time only (queries, and the offline LLM's precompute,
    render once)."""
    text = backend.apply_chat_template(request.messages) if request.messages is not None else request.prompt
    return document_hints(request.documents, text) is not None
