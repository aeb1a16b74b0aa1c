"""The document cache's disk tier on a real engine: KV that outlives the engine, and never a wrong entry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inferplug.engine.doc_disk_key import model_identity
from inferplug.errors import ProfileError
from inferplug.rag import document_key, rag_prompt
from inferplug.rag.layout import document_spans
from inferplug.types import Request
from tests.engine.engine_helpers import greedy, make_engine, run_all, tokens_of


DOCS = ["The red fox lives in the northern forest and eats berries.",
        "Blue whales sing long songs that travel across the ocean.",
        "Copper wires carry current between the two brass plates."]


def _request(question: str, docs: list[str], session: str, salt: str | None = None) -> Request:
    prompt = f"Session {session}.\n" + rag_prompt(question, docs)  # its own first line: no block prefix hits
    return Request(prompt=prompt, params=greedy(6), documents=document_spans(prompt, docs), cache_salt=salt)


def _disk_engine(model_dir: Path, folder: Path, limit: int = 64 << 20, **overrides):
    return make_engine(model_dir, rag_disk_dir=str(folder), rag_disk_bytes=limit,
                       model_identity=model_identity(model_dir), **overrides)


def _entries(folder: Path) -> list[Path]:
    return sorted(folder.glob("*/*.kv"))


def _answer(engine, request: Request) -> list[int]:
    return tokens_of(run_all(engine, [request])[request.request_id])


def test_a_fresh_engine_reuses_the_disk_tier_as_the_first_reused_its_memory(tiny_llama_dir, tmp_path):
    first = _disk_engine(tiny_llama_dir, tmp_path)
    run_all(first, [_request("q1", DOCS, "a")])
    assert len(_entries(tmp_path)) == len(DOCS) and first.doc_cache.stats()["doc_cache_disk_writes"] == len(DOCS)
    with_memory = _answer(first, _request("Who sings?", [DOCS[2], DOCS[0], DOCS[1]], "b"))  # moved documents

    fresh = _disk_engine(tiny_llama_dir, tmp_path)  # nothing in its memory
    assert _answer(fresh, _request("Who sings?", [DOCS[2], DOCS[0], DOCS[1]], "b")) == with_memory
    stats = fresh.stats()
    assert stats["doc_cache_disk_loads"] == stats["doc_cache_injected"] == len(DOCS)
    assert stats["doc_cache_hit_rate"] == 1.0 and stats["doc_cache_disk_writes"] == 0
    for key, entry in first.doc_cache.entries.items():  # bit for bit what the first engine computed
        assert torch.equal(fresh.doc_cache.entries[key].k, entry.k)
        assert torch.equal(fresh.doc_cache.entries[key].v, entry.v)
    assert stats["doc_cache_disk_bytes"] == sum(p.stat().st_size for p in _entries(tmp_path))
    assert stats["doc_cache_bytes"] == sum(e.nbytes for e in fresh.doc_cache.entries.values())


_SECOND_PROCESS = """
import json, sys
from inferplug.engine.config import EngineConfig
from inferplug.engine.doc_disk_key import model_identity
from inferplug.engine.llm_engine import LLMEngine
from inferplug.models.loader import load_tokenizer, load_weights, read_config
from inferplug.types import DocumentSpan, Request, SamplingParams
model_dir, folder, prompt, spans = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
config = EngineConfig(num_kv_blocks=128, max_num_batched_tokens=256, rag_disk_dir=folder, rag_disk_bytes=64 << 20,
                      model_identity=model_identity(model_dir))
engine = LLMEngine(read_config(model_dir), load_weights(model_dir, config.torch_dtype), load_tokenizer(model_dir), config)
engine.add_request(Request(prompt=prompt, params=SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True),
                           documents=[DocumentSpan(**s) for s in spans]))
tokens = []
while engine.has_unfinished():
    tokens += [t for e in engine.step() for t in e.token_ids]
print(json.dumps({"tokens": tokens, "stats": engine.stats()}))
"""


def test_a_second_process_reuses_the_disk_tier(tiny_llama_dir, tmp_path):
    first = _disk_engine(tiny_llama_dir, tmp_path)
    run_all(first, [_request("q1", DOCS, "a")])
    request = _request("Who sings?", DOCS[::-1], "b")
    expected = _answer(first, _request("Who sings?", DOCS[::-1], "b"))
    spans = [{"start": s.start, "end": s.end, "key": s.key} for s in request.documents]
    out = subprocess.run([sys.executable, "-c", _SECOND_PROCESS, str(tiny_llama_dir), str(tmp_path), request.prompt,
                          json.dumps(spans)], capture_output=True, text=True, timeout=600, env=os.environ)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["stats"]["doc_cache_disk_loads"] == len(DOCS)
    assert result["tokens"] == expected


@pytest.mark.parametrize("damage", ["truncate", "flip a byte"])
def test_a_damaged_entry_is_rejected_and_computed_again(tiny_llama_dir, tmp_path, damage):
    run_all(_disk_engine(tiny_llama_dir, tmp_path), [_request("q1", DOCS, "a")])
    victim = _entries(tmp_path)[0]
    data = victim.read_bytes()
    victim.write_bytes(data[:-100] if damage == "truncate" else data[:500] + bytes([data[500] ^ 1]) + data[501:])
    engine = _disk_engine(tiny_llama_dir, tmp_path)
    expected = _answer(make_engine(tiny_llama_dir), _request("q1", DOCS, "a"))  # all computed, as the first was
    assert _answer(engine, _request("q1", DOCS, "a")) == expected
    stats = engine.stats()
    assert stats["doc_cache_disk_rejected"] == 1 and stats["doc_cache_disk_loads"] == len(DOCS) - 1
    assert stats["doc_cache_disk_writes"] == 1 and victim.read_bytes() == data  # computed and written afresh


def test_salted_tenants_never_share_document_kv_on_disk(tiny_llama_dir, tmp_path):
    run_all(_disk_engine(tiny_llama_dir, tmp_path), [_request("q1", DOCS, "a", salt="tenant-1")])
    other = _disk_engine(tiny_llama_dir, tmp_path)
    run_all(other, [_request("q2", DOCS, "b", salt="tenant-2")])
    assert other.stats()["doc_cache_disk_loads"] == 0 and other.stats()["doc_cache_injected"] == 0
    folders = sorted(p.parent.name for p in _entries(tmp_path))
    assert len(set(folders)) == 2 and all("tenant" not in name for name in folders)  # the salt is never written
    same = _disk_engine(tiny_llama_dir, tmp_path)
    run_all(same, [_request("q3", DOCS, "c", salt="tenant-1")])
    assert same.stats()["doc_cache_disk_loads"] == len(DOCS)


def test_every_tenant_reads_the_shared_corpus_and_writes_only_its_own(tiny_llama_dir, tmp_path):
    run_all(_disk_engine(tiny_llama_dir, tmp_path), [_request("q1", DOCS[:2], "a", salt="corpus")])
    tenant = _disk_engine(tiny_llama_dir, tmp_path, rag_shared_salt="corpus")
    run_all(tenant, [_request("q2", DOCS, "b", salt="tenant-1")])
    assert tenant.stats()["doc_cache_disk_loads"] == 2 and tenant.stats()["doc_cache_disk_writes"] == 1
    by_folder = {}
    for path in _entries(tmp_path):
        by_folder.setdefault(path.parent.name, []).append(path)
    assert sorted(map(len, by_folder.values())) == [1, 2]  # the tenant's own document went to its own folder
    stranger = _disk_engine(tiny_llama_dir, tmp_path)  # no shared salt: the corpus's entries are not its own
    run_all(stranger, [_request("q3", DOCS, "c", salt="tenant-2")])
    assert stranger.stats()["doc_cache_disk_loads"] == 0


def test_the_bound_evicts_the_least_recently_used_entries(tiny_llama_dir, tmp_path):
    probe = _disk_engine(tiny_llama_dir, tmp_path / "probe")
    run_all(probe, [_request("q", DOCS[:1], "a")])
    size = _entries(tmp_path / "probe")[0].stat().st_size
    limit = 2 * size + size // 2
    engine = _disk_engine(tiny_llama_dir, tmp_path / "bounded", limit=limit)
    for session, doc in [("0", DOCS[0]), ("1", DOCS[1]), ("2", DOCS[0]), ("3", DOCS[2])]:  # DOCS[0] used again
        run_all(engine, [_request("q", [doc], session)])
    kept = _entries(tmp_path / "bounded")
    assert {p.name[:16] for p in kept} == {document_key(DOCS[0]), document_key(DOCS[2])}  # DOCS[1] was the LRU
    assert engine.stats()["doc_cache_disk_bytes"] == sum(p.stat().st_size for p in kept) <= limit
    fresh = _disk_engine(tiny_llama_dir, tmp_path / "bounded", limit=limit)
    run_all(fresh, [_request("q", [DOCS[0], DOCS[2]], "z")])
    assert fresh.stats()["doc_cache_disk_loads"] == 2 and fresh.stats()["doc_cache_disk_writes"] == 0
    too_small = _disk_engine(tiny_llama_dir, tmp_path / "small", limit=size // 2)
    run_all(too_small, [_request("q", DOCS[:1], "a")])
    assert _entries(tmp_path / "small") == [] and too_small.stats()["doc_cache_disk_writes"] == 0


def test_evicting_a_document_or_a_salt(tiny_llama_dir, tmp_path):
    engine = _disk_engine(tiny_llama_dir, tmp_path)
    run_all(engine, [_request("q1", DOCS, "a"), _request("q1", DOCS, "t", salt="tenant")])
    assert engine.doc_cache.evict([DOCS[0]]) == 2  # in memory and on disk, the unsalted entry only
    assert len(_entries(tmp_path)) == 2 * len(DOCS) - 1
    fresh = _disk_engine(tiny_llama_dir, tmp_path)
    run_all(fresh, [_request("q2", DOCS, "b")])
    assert fresh.stats()["doc_cache_disk_loads"] == len(DOCS) - 1 and fresh.stats()["doc_cache_disk_writes"] == 1
    assert fresh.doc_cache.evict(None, "tenant") == len(DOCS)  # the whole salt: on disk (none was in memory)
    assert engine.doc_cache.evict(None, "tenant") == len(DOCS)  # this engine's memory still held them
    assert len(_entries(tmp_path)) == len(DOCS)


def test_another_model_pool_or_version_never_reads_an_entry(tiny_llama_dir, tmp_path, monkeypatch):
    run_all(_disk_engine(tiny_llama_dir, tmp_path), [_request("q1", DOCS, "a")])
    with monkeypatch.context() as patch:  # an upgrade that changes what a segment's entry means
        patch.setattr("inferplug.engine.doc_disk_key.DOC_KV_VERSION", 2)
        engine = _disk_engine(tiny_llama_dir, tmp_path)
        run_all(engine, [_request("q1", DOCS, "a")])
        assert engine.stats()["doc_cache_disk_loads"] == 0
    for overrides in ({"block_size": 32}, {"kv_dtype": "bfloat16"},
                      {"model_identity": model_identity(tiny_llama_dir, weight_format="int8")}):
        engine = make_engine(tiny_llama_dir, rag_disk_dir=str(tmp_path), rag_disk_bytes=64 << 20,
                             **{"model_identity": model_identity(tiny_llama_dir), **overrides})
        run_all(engine, [_request("q1", DOCS, "a")])
        assert engine.stats()["doc_cache_disk_loads"] == 0 and engine.stats()["doc_cache_disk_rejected"] == 0


def test_symlinks_are_never_followed(tiny_llama_dir, tmp_path):
    run_all(_disk_engine(tiny_llama_dir, tmp_path / "tier"), [_request("q1", DOCS, "a")])
    victim = _entries(tmp_path / "tier")[0]
    outside = tmp_path / "outside.kv"
    outside.write_bytes(victim.read_bytes())
    engine = _disk_engine(tiny_llama_dir, tmp_path / "tier")
    victim.unlink()
    victim.symlink_to(outside)  # a link where an entry belongs: not read, replaced by a real file
    run_all(engine, [_request("q1", DOCS, "a")])
    assert engine.stats()["doc_cache_disk_loads"] == len(DOCS) - 1 and engine.stats()["doc_cache_disk_rejected"] == 1
    assert not victim.is_symlink() and outside.exists()
    (tmp_path / "linked").symlink_to(tmp_path / "tier")
    with pytest.raises(ProfileError, match="symlink"):
        _disk_engine(tiny_llama_dir, tmp_path / "linked")


def test_a_folder_it_cannot_write_leaves_the_requests_running_from_memory(tiny_llama_dir, tmp_path):
    engine = _disk_engine(tiny_llama_dir, tmp_path)
    (tmp_path / "unsalted").write_text("a file where the unsalted entries' folder belongs")
    expected = _answer(make_engine(tiny_llama_dir), _request("q1", DOCS, "a"))
    assert _answer(engine, _request("q1", DOCS, "a")) == expected
    assert engine.stats()["doc_cache_disk_writes"] == 0 and engine.stats()["doc_cache_stored"] == len(DOCS)
