"""Turning TOML and validation failures into one-line errors that name the file, the key and the fix,
and telling where each effective profile value came from (file, env or default)."""

from __future__ import annotations

import difflib
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from inferplug.errors import ProfileError
from inferplug.profile_schema import Profile


def read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path}: TOML syntax error: {exc}. Fix: correct the TOML at that line") from None
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read the profile ({exc.strerror}). Fix: check the path and its permissions") from None


def explain_validation_error(exc: ValidationError, path: str | Path, env_data: dict) -> str:
    """The first validation error as one line (`path`: the file, or the model an implicit profile comes from);
    the count of any others is appended."""
    errors = exc.errors()
    err = errors[0]
    loc = [str(p) for p in err["loc"] if not isinstance(p, int)]
    key = ".".join(loc)
    from_env = bool(loc) and _has(env_data, loc)
    where = f"env INFERPLUG_{'__'.join(loc).upper()}" if from_env else f"{path}: {key}" if key else str(path)
    more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    if err["type"] == "extra_forbidden":
        table = _model_at(Profile, loc[:-1])
        valid = list(table.model_fields) if table else []
        close = difflib.get_close_matches(loc[-1], valid, n=1, cutoff=0.5)
        hint = f"did you mean {'.'.join([*loc[:-1], close[0]])!r}?" if close else "remove it"
        scope = f"[{'.'.join(loc[:-1])}]" if loc[:-1] else "the top level"
        return f"{where}: unknown key {key!r}; {hint} Valid keys in {scope}: {', '.join(valid)}{more}"
    if err["type"] == "missing":
        return f"{where}: required key is missing. Fix: add {key} to the profile{more}"
    got = f" (got {err['input']!r})" if not isinstance(err.get("input"), dict) else ""
    fix = "unset or correct that variable" if from_env else f"edit {key or 'the profile'} in the file"
    msg = err["msg"].removeprefix("Value error, ")
    return f"{where}: {msg}{got}. Fix: {fix}{more}"


def value_origins(profile: BaseModel, file_data: dict, env_data: dict) -> list[tuple[str, Any, str]]:
    """(dotted key, value, origin) for every leaf value; origin is 'env', 'file' or 'default'."""
    rows: list[tuple[str, Any, str]] = []

    def walk(model: BaseModel, prefix: list[str]) -> None:
        for name in type(model).model_fields:
            value = getattr(model, name)
            loc = [*prefix, name]
            if isinstance(value, BaseModel):
                walk(value, loc)
                continue
            origin = "env" if _has(env_data, loc) else "file" if _has(file_data, loc) else "default"
            rows.append((".".join(loc), value, origin))

    walk(profile, [])
    return rows


def _has(data: dict, loc: list[str]) -> bool:
    for part in loc:
        if not isinstance(data, dict) or part not in data:
            return False
        data = data[part]
    return True


def _model_at(model: type[BaseModel], loc: list[str]) -> type[BaseModel] | None:
    """The pydantic model class of the table at `loc` (e.g. ['cache'] -> Cache)."""
    for part in loc:
        field = model.model_fields.get(part)
        if field is None:
            return None
        ann = field.annotation
        candidates = [ann, *getattr(ann, "__args__", ())]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if model is None:
            return None
    return model
