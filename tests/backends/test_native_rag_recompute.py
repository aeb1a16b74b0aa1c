"""[cache] rag_recompute from the profile down: the native backend's engine recomputes reused document tokens and
reports their count in stats() and /metrics."""

from __future__ import annotations

from inferplug.rag import document_spans, rag_prompt
from inferplug.types import Request, SamplingParams

DOCS = ["The red fox lives in the northern forest and eats berries all summer long.",
        "Blue whales sing long songs that travel across the cold ocean for miles."]


def test_the_profile_policy_recomputes_and_metrics_count_it(tmp_path, tiny_llama_dir):
    from inferplug.backends.registry import close_backend, get_backend
    from inferplug.server.metrics import ServerMetrics

    path = tmp_path / "blend.toml"
    path.write_text(f'name = "tiny-blend"\nbackend = "native"\ndtype = "float32"\n[model]\npath = "{tiny_llama_dir}"\n'
                    '[cache]\nrag_document_cache = true\nrag_recompute = "chunk_heads"\nrag_recompute_fraction = 0.3\n')
    backend = get_backend(path)
    try:
        for session, docs in (("a", DOCS), ("b", DOCS[::-1])):  # stored, then reused next to other text
            prompt = f"Session {session}.\n" + rag_prompt("Who eats berries?", docs)
            request = Request(prompt=prompt, params=SamplingParams(temperature=0.0, max_tokens=2),
                              documents=document_spans(prompt, docs))
            assert list(backend.stream_sync(request))[-1].finish_reason is not None
        stats = backend.stats()
        assert stats["doc_cache_injected"] == 2 and stats["doc_cache_recomputed_tokens"] > 0
        text = ServerMetrics(backend).render().decode()
        assert f"inferplug_doc_cache_recomputed_tokens {float(stats['doc_cache_recomputed_tokens'])}" in text
    finally:
        close_backend(path)
