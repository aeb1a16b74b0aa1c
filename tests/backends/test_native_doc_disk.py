"""The document KV disk tier from the profile down: [cache] keys, the native backend and LLM() precompute, evict
and report it (stats and /metrics)."""

from __future__ import annotations

import pytest

from inferplug.errors import ProfileError
from inferplug.profile import load_profile

DOCS = ["The red fox lives in the northern forest and eats berries.",
        "Blue whales sing long songs that travel across the ocean."]


def _profile_file(tmp_path, model_dir, cache: str):
    path = tmp_path / "disk.toml"
    path.write_text(f'name = "tiny-disk"\nbackend = "native"\ndtype = "float32"\n'
                    f'[model]\npath = "{model_dir}"\nserved_name = "tiny"\n[cache]\nrag_document_cache = true\n{cache}\n')
    return path


@pytest.mark.parametrize("size", ["lots", "-1GiB", "4 parsecs"])
def test_a_bad_disk_size_names_the_key_and_the_fix(tmp_path, tiny_llama_dir, size):
    with pytest.raises(ProfileError, match=r"rag_disk_size.*\"0\" to turn"):
        load_profile(_profile_file(tmp_path, tiny_llama_dir, f'rag_disk_size = "{size}"'))


def test_disk_size_and_folder(tmp_path, tiny_llama_dir, monkeypatch):
    from inferplug.backends.native import doc_disk_settings
    from inferplug.hardware import probe
    from inferplug.resolver import resolve

    assert load_profile(_profile_file(tmp_path, tiny_llama_dir, "")).cache.rag_disk_bytes() == 0  # off by default
    monkeypatch.setenv("INFERPLUG_HOME", str(tmp_path / "home"))
    profile = load_profile(_profile_file(tmp_path, tiny_llama_dir, 'rag_disk_size = "2GiB"\nrag_shared_salt = "kb"'))
    settings = doc_disk_settings(profile, resolve(profile, probe()), tiny_llama_dir)
    assert settings["rag_disk_bytes"] == 2 << 30 and settings["rag_shared_salt"] == "kb"
    assert settings["rag_disk_dir"] == str(tmp_path / "home" / "doc-kv")  # relative: under INFERPLUG_HOME
    assert str(tiny_llama_dir) in settings["model_identity"]  # no pull record: path, size and mtime


def test_llm_precomputes_and_a_fresh_llm_reads_the_disk(tmp_path, tiny_llama_dir):
    from inferplug import LLM

    path = _profile_file(tmp_path, tiny_llama_dir, f'rag_disk_size = "64MiB"\nrag_disk_dir = "{tmp_path / "kv"}"')
    first = LLM(profile=path, num_kv_blocks=64)
    assert first.precompute_documents(DOCS) == 2
    assert first.stats()["doc_cache_disk_writes"] == 2 and first.stats()["doc_cache_stored"] == 2
    fresh = LLM(profile=path, num_kv_blocks=64)
    assert fresh.precompute_documents(DOCS) == 2  # found on disk: nothing computed again
    stats = fresh.stats()
    assert (stats["doc_cache_disk_loads"], stats["doc_cache_stored"], stats["doc_cache_hit_rate"]) == (2, 0, 1.0)
    assert fresh.evict_documents(DOCS[:1]) == 2 and fresh.evict_documents() == 2  # one, then the rest of the salt
    assert fresh.stats()["doc_cache_disk_bytes"] == 0 == fresh.stats()["doc_cache_bytes"]


def test_the_backend_reports_both_tiers_in_metrics(tmp_path, tiny_llama_dir):
    from inferplug.backends.registry import close_backend, get_backend
    from inferplug.frontend.precompute import precompute_documents
    from inferplug.server.metrics import ServerMetrics

    path = _profile_file(tmp_path, tiny_llama_dir, f'rag_disk_size = "64MiB"\nrag_disk_dir = "{tmp_path / "kv"}"\n'
                                                   'rag_shared_salt = "corpus"')
    backend = get_backend(path)
    try:
        assert precompute_documents(backend, DOCS) == 2  # under the profile's shared salt
        stats = backend.stats()
        assert stats["doc_cache_disk_bytes"] > 0 and stats["doc_cache_bytes"] > 0
        text = ServerMetrics(backend).render().decode()
        assert f'inferplug_doc_cache_bytes{{tier="disk"}} {float(stats["doc_cache_disk_bytes"])}' in text
        assert f'inferplug_doc_cache_bytes{{tier="memory"}} {float(stats["doc_cache_bytes"])}' in text
        assert "inferplug_doc_cache_hit_rate 0.0" in text
        assert backend.evict_documents(None) == 0  # nothing is unsalted
        assert backend.evict_documents(None, "corpus") == 4
    finally:
        close_backend(path)
