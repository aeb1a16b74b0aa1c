"""A profile written back as TOML (`inferplug profile show --toml`, and an implicit profile's show): the values that
differ from the defaults, so the file is short, and loads back to the same profile."""

from __future__ import annotations

import json
from typing import Any

from inferplug.profile import Profile


def profile_toml(profile: Profile) -> str:
    lines: list[str] = []
    _table(profile.model_dump(mode="json", exclude_defaults=True), [], lines)
    return "\n".join(lines).strip() + "\n"


def _table(data: dict[str, Any], prefix: list[str], lines: list[str]) -> None:
    values = {k: v for k, v in data.items() if not isinstance(v, dict)}
    if prefix and values:
        lines += ["", f"[{'.'.join(prefix)}]"]
    lines += [f"{key} = {_value(value)}" for key, value in values.items()]
    for key, value in data.items():
        if isinstance(value, dict):
            _table(value, [*prefix, key], lines)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # JSON's escapes are TOML basic-string escapes
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")
