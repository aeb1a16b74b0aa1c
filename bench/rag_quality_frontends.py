"""Issue 43's gate 3 through the front ends: LangChain and LlamaIndex RAG with the document cache on (the opt-in),
against the same front end with it off (every prompt computed in full), on SmolLM2.

On the QA set (bench/data/rag_qa_set.json): each query's six chunks go through LangChain's
`ChatPromptTemplate | ChatInferPlug` with `chat.format_documents(docs)`, and through LlamaIndex's response
synthesizer with `llm.document_hints()` over the same chunks as nodes; greedy answers, token F1 against gold, paired
(on minus off) with a bootstrap 95% interval, and the document-cache tokens reused counted (the corpus is not stored
first: the cache fills as queries come, as in an app; the two front ends share one engine, whose prefix cache also
serves a prompt the other already sent, so both caches' reused tokens count). On the demo's corpus (`inferplug
demo`'s four questions, retrieved by its own MiniLM index): each answer's F1 against its planted fact, on and off.

    nice .venv/bin/python bench/rag_quality_frontends.py --queries 150 --json rag-quality-frontends.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tqdm import tqdm

from inferplug.benchmark.rag_fidelity import F1_BAR, f1_score, quality_summary
from inferplug.rag.layout import DEFAULT_SYSTEM

SET_FILE = Path(__file__).parent / "data" / "rag_qa_set.json"
PROFILE = "smollm2-135m"


def _reused(backend) -> int:
    """Prompt tokens the engine took from its caches so far: the prefix cache's and the document cache's."""
    stats = backend.stats()
    return stats["prefix_hit_tokens"] + stats.get("doc_cache_hit_tokens", 0)


def _profile(document_cache: bool):
    from inferplug.profile import load_profile, with_tables

    return with_tables(load_profile(PROFILE), cache={"rag_document_cache": document_cache})


def langchain_answers(document_cache: bool, qa: dict, max_tokens: int) -> tuple[list[str], int]:
    from langchain_core.documents import Document
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_inferplug import ChatInferPlug

    chat = ChatInferPlug(profile=_profile(document_cache), temperature=0, max_tokens=max_tokens)
    chain = ChatPromptTemplate.from_messages([("system", DEFAULT_SYSTEM + "\n\nContext documents:\n\n{context}"),
                                              ("human", "{question}")]) | chat
    before = _reused(chat.backend)
    answers = []
    for question, ids in tqdm(list(zip(qa["questions"], qa["retrieved"])), desc=f"langchain, cache {document_cache}"):
        context = chat.format_documents([Document(page_content=qa["chunks"][c]) for c in ids])
        answers.append(chain.invoke({"context": context, "question": question}).content)
    return answers, _reused(chat.backend) - before


def llamaindex_answers(document_cache: bool, qa: dict, max_tokens: int) -> tuple[list[str], int]:
    from llama_index.core import ChatPromptTemplate, get_response_synthesizer
    from llama_index.core.schema import NodeWithScore, TextNode
    from llama_index.llms.inferplug import InferPlug

    llm = InferPlug(profile=_profile(document_cache), temperature=0.0, max_tokens=max_tokens)
    synthesizer = get_response_synthesizer(llm=llm, text_qa_template=ChatPromptTemplate.from_messages(
        [("system", DEFAULT_SYSTEM + "\n\nContext documents:\n\n{context_str}"), ("user", "{query_str}")]))
    hints = llm.document_hints()
    before = _reused(llm.backend)
    answers = []
    for question, ids in tqdm(list(zip(qa["questions"], qa["retrieved"])), desc=f"llamaindex, cache {document_cache}"):
        nodes = [NodeWithScore(node=TextNode(text=qa["chunks"][c]), score=1.0) for c in ids]
        answers.append(str(synthesizer.synthesize(question, hints.postprocess_nodes(nodes, query_str=question))))
    return answers, _reused(llm.backend) - before


def demo_answers(document_cache: bool, max_tokens: int) -> tuple[list[str], list[str]]:
    """The demo's questions through its own query engine: (answers, the planted facts)."""
    from inferplug.commands.demo import QUESTIONS, build_query_engine

    engine, _, _ = build_query_engine(PROFILE, top_k=3, max_tokens=max_tokens, document_cache=document_cache)
    return ["".join(engine.query(q).response_gen) for q, _ in QUESTIONS], [fact for _, fact in QUESTIONS]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queries", type=int, default=150)
    ap.add_argument("--answer-tokens", type=int, default=24)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    data = json.loads(SET_FILE.read_text())
    qa = {k: data[k][:args.queries] for k in ("questions", "gold", "retrieved")} | {"chunks": data["chunks"]}
    report = {"queries": len(qa["questions"]), "answer_tokens": args.answer_tokens}
    for name, run in (("langchain", langchain_answers), ("llamaindex", llamaindex_answers)):
        (on, hits), (off, plain_hits) = run(True, qa, args.answer_tokens), run(False, qa, args.answer_tokens)
        row = quality_summary([f1_score(a, g) for a, g in zip(on, qa["gold"])],
                              [f1_score(a, g) for a, g in zip(off, qa["gold"])])
        row |= {"reused_tokens": hits, "reused_tokens_cache_off": plain_hits,
                "gate3": row["f1_diff"] >= F1_BAR and row["f1_diff_high"] >= 0 and hits > plain_hits}
        report[name] = row
        print(name, row, flush=True)
    (on, facts), (off, _) = demo_answers(True, args.answer_tokens), demo_answers(False, args.answer_tokens)
    report["demo"] = {"f1_on": [f1_score(a, f) for a, f in zip(on, facts)],
                      "f1_off": [f1_score(a, f) for a, f in zip(off, facts)],
                      "fact_on": [f.lower() in a.lower() for a, f in zip(on, facts)],
                      "fact_off": [f.lower() in a.lower() for a, f in zip(off, facts)], "answers_on": on,
                      "answers_off": off}
    print("demo corpus:", {k: v for k, v in report["demo"].items() if not k.startswith("answers")})
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
