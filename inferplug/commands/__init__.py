"""CLI subcommands. Each module exposes `register(subparsers)`, which adds its parser and sets `func`
(called with the parsed args; returns the exit code or None). inferplug.cli finds them with pkgutil.

The arguments several commands take are added here, so they read and default the same everywhere.
"""

from __future__ import annotations

import argparse


def add_profile_argument(parser: argparse.ArgumentParser, note: str = "") -> None:
    """The optional PROFILE positional; None (not given) loads the default profile."""
    parser.add_argument("profile", nargs="?", help=f"profile name or .toml path (default: smollm2-135m){note}")


def add_json_flag(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--json", action="store_true", help=f"print {what} as JSON")
