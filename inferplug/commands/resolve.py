"""`inferplug resolve [PROFILE]`: the plan for a profile on this machine, with the reason for each choice."""

from __future__ import annotations

import argparse
import json

from inferplug.commands import add_context_flag, add_json_flag, add_profile_argument, load_with_context


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("resolve", help="show which backend, device, dtype and cache a profile gets here")
    add_profile_argument(p)
    add_context_flag(p)
    add_json_flag(p, "the plan")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from inferplug.errors import ResolveError
    from inferplug.hardware import probe
    from inferplug.resolver import resolve

    profile = load_with_context(args)
    try:
        plan = resolve(profile, probe())
    except ResolveError as exc:
        rejected = getattr(exc, "rejected", None)
        if rejected is None:
            raise
        if args.json:
            print(json.dumps({"profile": profile.name, "error": str(exc), "rejected": rejected}, indent=2))
        else:
            _print_rejected(profile.name, rejected)
        return 2
    if args.json:
        print(json.dumps({"profile": profile.name, **plan.to_dict()}, indent=2))
        return 0
    _print_plan(profile.name, plan)
    return 0


def _print_plan(name: str, plan) -> None:  # noqa: ANN001 - a plan.Plan
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"plan for {name}", show_header=False)
    for key in ("backend", "device", "dtype", "attention", "kv_dtype", "compute_type", "block_size", "num_kv_blocks",
                "max_model_len", "max_num_seqs", "max_num_batched_tokens",
                "max_prefill_tokens_while_decoding", "tensor_parallel_size"):
        if getattr(plan, key) is not None:
            table.add_row(key, str(getattr(plan, key)))
    console.print(table)
    console.print("[bold]why[/bold]")
    for reason in plan.reasons:
        console.print(f"  - {reason}", highlight=False, markup=False)
    _print_rejected(None, plan.rejected, console)


def _print_rejected(name: str | None, rejected: dict[str, str], console=None) -> None:  # noqa: ANN001
    from rich.console import Console

    console = console or Console()
    if name:
        console.print(f"[bold red]profile {name} cannot run on this machine[/bold red]")
    console.print("[bold]other backends[/bold]" if not name else "[bold]why not, per backend[/bold]")
    for backend, why in rejected.items():
        console.print(f"  - {backend}: {why}", highlight=False, markup=False)
