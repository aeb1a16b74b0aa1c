"""`inferplug profile list` and `inferplug profile show NAME` (each value with its origin, or as TOML)."""

from __future__ import annotations

import argparse
import json

from inferplug.commands import add_json_flag, add_profile_argument


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("profile", help="list profiles, or show one with the origin of each value")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="the profiles found by name")
    add_json_flag(listing, "the list")
    listing.set_defaults(func=run_list)
    show = actions.add_parser("show", help="a profile's effective values and where each came from (file, env, default); "
                                          "a model's implicit profile as TOML")
    add_profile_argument(show)
    add_json_flag(show, "the values and their origins")
    show.add_argument("--toml", action="store_true",
                      help="print the profile as TOML to save and edit (the default for a model's implicit profile)")
    show.set_defaults(func=run_show)


def run_list(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from inferplug.errors import ProfileError
    from inferplug.profile import DEFAULT_PROFILE, list_profiles, load_profile

    rows = []
    for name, path in list_profiles().items():
        row = {"name": name, "path": str(path), "default": name == DEFAULT_PROFILE}
        try:
            profile = load_profile(path)
            row.update(backend=profile.backend, model=profile.model.describe(), description=profile.description)
        except ProfileError as exc:  # one broken file must not hide the others
            row.update(backend="?", model="?", description=f"invalid: {exc}")
        rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = Table("name", "backend", "model", "description")
    for row in rows:
        table.add_row(row["name"] + (" (default)" if row["default"] else ""), row["backend"], row["model"],
                      escape(row["description"]))
    Console().print(table)
    return 0


def run_show(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from inferplug.profile import env_values, load_profile
    from inferplug.profile_errors import value_origins
    from inferplug.profile_toml import profile_toml

    profile = load_profile(args.profile)
    if args.toml or (profile.source_file is None and not args.json):
        print(profile_toml(profile), end="")
        return 0
    rows = value_origins(profile, profile.file_data, env_values())
    if args.json:
        values = [{"key": k, "value": v if isinstance(v, (int, float, bool, str, list, type(None))) else str(v),
                   "origin": o} for k, v, o in rows]
        print(json.dumps({"profile": profile.name, "file": str(profile.source_file), "values": values}, indent=2))
        return 0
    table = Table("key", "value", "origin", title=f"{profile.name} ({profile.source_file})")
    style = {"file": "green", "env": "yellow", "default": "dim"}
    for key, value, origin in rows:
        table.add_row(key, repr(value) if isinstance(value, str) else str(value), f"[{style[origin]}]{origin}[/]")
    Console().print(table)
    return 0
