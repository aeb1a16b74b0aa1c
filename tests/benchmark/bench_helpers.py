"""Helpers shared by the bench tests (imported as tests.benchmark.bench_helpers, as every tests helper is)."""

import argparse
import socket

from inferplug.commands import bench


def parse(*argv: str) -> argparse.Namespace:
    """`inferplug bench ARGV` parsed by the command's own parser."""
    parser = argparse.ArgumentParser()
    bench.register(parser.add_subparsers())
    return parser.parse_args(["bench", *argv])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
