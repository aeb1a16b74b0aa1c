"""`inferplug doctor`: what this machine can run (see inferplug.doctor)."""

from __future__ import annotations

import argparse

from inferplug.commands import add_json_flag


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("doctor", help="report the machine, the usable backends and which profiles fit")
    add_json_flag(p, "the report")
    p.add_argument("--bench", action="store_true", help="also measure matmul speed and memory bandwidth (~20 s)")
    p.add_argument("--bench-seconds", type=float, default=20.0, help="time budget of the --bench measurements")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from inferplug.doctor import run_doctor

    return run_doctor(as_json=args.json, bench=args.bench, bench_seconds=args.bench_seconds)
