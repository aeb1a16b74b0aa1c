"""Helpers shared by the bench tests (imported as tests.benchmark.bench_helpers, as every tests helper is)."""

import argparse
import importlib.util
import socket
import sys
from pathlib import Path
from types import ModuleType

from inferplug.commands import bench

BENCH = Path(__file__).resolve().parents[2] / "bench"


def parse(*argv: str) -> argparse.Namespace:
    """`inferplug bench ARGV` parsed by the command's own parser."""
    parser = argparse.ArgumentParser()
    bench.register(parser.add_subparsers())
    return parser.parse_args(["bench", *argv])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_bench(name: str) -> ModuleType:
    """bench/NAME.py as the module bench_NAME (in sys.modules: dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
