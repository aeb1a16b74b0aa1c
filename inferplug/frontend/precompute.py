"""Document KV at indexing time, over the Backend protocol: what the integrations' precompute helpers run.

Each document becomes one precompute request (rag/precompute.py); a few run at once so the engine batches them.
"""

from __future__ import annotations

import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from inferplug.errors import GenerationError
from inferplug.frontend.requests import UncachedDocumentsWarning
from inferplug.rag.precompute import precompute_request


def precompute_documents(backend: Any, docs: list[Any], salt: str | None = None, *, concurrency: int = 8) -> int:
    """Compute and store each document's KV (str, LangChain Document or LlamaIndex node) on `backend`, under `salt`:
    the salt the corpus is served under (a tenant's, for its private corpus); None: the profile's
    [cache] rag_shared_salt. Returns the documents computed; 0, with a warning, on a backend without a document
    cache. GenerationError when one fails."""
    if not backend.capabilities.rag_cache:
        warnings.warn(f"the {backend.name} backend has no document cache: nothing is precomputed. Use a profile on "
                      "the native engine to cache documents.", UncachedDocumentsWarning, stacklevel=2)
        return 0
    salt = salt if salt is not None else backend.profile.cache.rag_shared_salt
    render = backend.apply_chat_template if backend.tokenizer is not None else None
    requests = [r for r in (precompute_request(d, salt, render) for d in docs) if r.documents]
    with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(requests)))) as pool:
        for events in pool.map(backend.generate_sync, requests):
            failed = next((e.error for e in events if e.error), None)
            if failed:
                raise GenerationError(f"precomputing a document's KV failed: {failed}")
    return len(requests)
