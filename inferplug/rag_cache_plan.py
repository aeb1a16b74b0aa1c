"""Whether the native engine reuses RAG documents' KV (engine/doc_cache.py), and why.

Off unless the profile opts in: reused document KV is an approximation, and judged as the field judges it
(docs/rag_cache.md, "How a policy is judged"; bench/rag_quality.py) no policy measured kept the answers'
distribution within the bound (SmolLM2: plain reuse and CacheBlend's deviation up to 0.30 of each document), so
the default keeps every prompt computed exactly.
"""

from __future__ import annotations

from inferplug.profile_schema import Cache


def document_cache_why(cache: Cache, family: str = "") -> str:
    """`family`: models/registry.py's name of the model's family ("": unknown)."""
    from inferplug.models.registry import family as family_of

    unfit = family_of(family).document_cache_why if family else ""
    if unfit:  # the opt-in would not change it: say why, not how to opt in
        opted = "the profile opts in, but " if cache.rag_document_cache else ""
        return f"RAG document cache off: {opted}it does not take a {family} model yet ({unfit})"
    if not cache.rag_document_cache:
        return ("RAG document cache off (the default): reused document KV moved SmolLM2's answers 560x the noise "
                "floor in KL, and 320x with 30% of each document recomputed, past the quality bound "
                "(docs/rag_cache.md); [cache] rag_document_cache = true opts in (time to first token ~20x lower "
                "than prefix caching on retrieved chunks in new orders)")
    if cache.rag_recompute == "none":
        return "RAG document cache on (pinned by the profile): reused document KV as stored, nothing recomputed"
    return (f"RAG document cache on (pinned by the profile): {cache.rag_recompute} recomputes "
            f"{cache.rag_recompute_fraction:g} of each reused document")
