"""`inferplug generate PROFILE "prompt"`: stream one completion to stdout."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from inferplug.commands import PROFILE_HELP, add_context_flag, load_with_context


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("generate", help="generate text for one prompt, streamed")
    p.add_argument("profile", help=f"{PROFILE_HELP} (e.g. smollm2-135m)")
    p.add_argument("prompt", help="the prompt text")
    p.add_argument("--chat", action="store_true", help="send the prompt as a user chat message (chat template)")
    add_context_flag(p)
    add_sampling_arguments(p)
    p.set_defaults(func=run)


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, help="most tokens to generate (default: the profile's)")
    p.add_argument("--temperature", type=float, help="0 is greedy (default: the profile's)")
    p.add_argument("--top-p", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--stop", action="append", help="a stop string (repeat for several; added to the profile's)")
    p.add_argument("--stats", action="store_true", help="print tokens, TTFT and tok/s to stderr at the end")


def cli_request(backend: Any, args: argparse.Namespace, **prompt: Any) -> Any:
    """The request for `prompt` (prompt= or messages=), from the one request builder: the command-line options
    over the profile's defaults."""
    from inferplug.frontend.requests import build_request

    options = {name: getattr(args, name) for name in ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop")}
    return build_request(backend, options=options, **prompt).request


def stream_reply(backend: Any, request: Any, show_stats: bool) -> str:
    """Print the request's text as it arrives; return it."""
    text = []
    for event in backend.stream_sync(request):
        print(event.text, end="", flush=True)
        text.append(event.text)
        if event.usage is not None and show_stats:
            t = event.timings
            rate = f"{1 / t.tpot:.1f} tok/s" if t.tpot else "n/a"
            print(f"\n[{event.usage.prompt_tokens} prompt ({event.usage.cached_tokens} cached), "
                  f"{event.usage.completion_tokens} generated, TTFT {t.ttft or 0:.3f}s, decode {rate}]",
                  file=sys.stderr, end="")
    print()
    return "".join(text)


def run(args: argparse.Namespace) -> int:
    from inferplug.backends.registry import close_all, get_backend

    backend = get_backend(load_with_context(args))
    prompt = {"messages": [{"role": "user", "content": args.prompt}]} if args.chat else {"prompt": args.prompt}
    try:
        stream_reply(backend, cli_request(backend, args, **prompt), args.stats)
    finally:
        close_all()
    return 0
