"""The `inferplug` command. Every module in inferplug/commands/ adds its subcommand via `register(subparsers)`.

Our errors (InferPlugError) become one line on stderr and exit code 2; each command keeps its
heavy imports inside the function it runs, so `inferplug doctor` starts fast.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from inferplug import __version__, commands
from inferplug.errors import InferPlugError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="inferplug", description="Fast local LLM inference for LangChain and LlamaIndex apps, driven by profiles."
    )
    parser.add_argument("--version", action="version", version=f"inferplug {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        importlib.import_module(f"{commands.__name__}.{module.name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except InferPlugError as exc:
        print(f"inferplug: error: {' '.join(str(exc).split())}", file=sys.stderr)  # always one line
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
