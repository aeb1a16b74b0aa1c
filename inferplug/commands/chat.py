"""`inferplug chat PROFILE`: an interactive, streaming chat in the terminal."""

from __future__ import annotations

import argparse

from inferplug.commands import add_context_flag, add_profile_argument, load_with_context
from inferplug.commands.generate import add_sampling_arguments, cli_request, stream_reply


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("chat", help="chat with a profile's model in the terminal (streaming)")
    add_profile_argument(p)
    add_context_flag(p)
    p.add_argument("--system", help="a system prompt")
    add_sampling_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from inferplug.backends.registry import close_all, get_backend

    backend = get_backend(load_with_context(args))
    messages = [{"role": "system", "content": args.system}] if args.system else []
    print(f"chatting with {backend.model_name} ({backend.name}); an empty line or Ctrl-D ends it")
    try:
        while True:
            try:
                line = input("you> ").strip()
            except EOFError:
                break
            if not line:
                break
            messages.append({"role": "user", "content": line})
            print("assistant> ", end="", flush=True)
            reply = stream_reply(backend, cli_request(backend, args, messages=list(messages)), args.stats)
            messages.append({"role": "assistant", "content": reply})
    finally:
        close_all()
    return 0
