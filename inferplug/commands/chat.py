"""`inferplug chat PROFILE`: an interactive, streaming chat in the terminal."""

from __future__ import annotations

import argparse

from inferplug.commands import add_context_flag, add_profile_argument, load_with_context
from inferplug.commands.generate import add_sampling_arguments, cli_request, stream_reply


COMMANDS = "/clear starts the conversation over, /help shows this, an empty line or Ctrl-D ends it"


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
    start = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(start)
    try:
        _check_chat_template(backend)
        print(f"chatting with {backend.model_name} ({backend.name}); {COMMANDS}")
        while True:
            try:
                line = input("you> ").strip()
            except EOFError:
                break
            if not line:
                break
            if line == "/clear":
                messages = list(start)
                print("(the conversation starts over)")
                continue
            if line == "/help":
                print(COMMANDS)
                continue
            messages.append({"role": "user", "content": line})
            print("assistant> ", end="", flush=True)
            reply = stream_reply(backend, cli_request(backend, args, messages=list(messages)), args.stats)
            messages.append({"role": "assistant", "content": reply})
    finally:
        close_all()
    return 0


def _check_chat_template(backend) -> None:  # noqa: ANN001 - a Backend
    """A model without a chat template cannot chat: say so before the first prompt, with what to run instead."""
    from inferplug.chat_template import NO_TEMPLATE_FIX, chat_template_text
    from inferplug.errors import ProfileError

    if backend.tokenizer is not None and chat_template_text(backend.profile, backend.tokenizer) is None:
        raise ProfileError(f"{backend.model_name} has no chat template (a base model's file carries none), so it "
                           f"cannot chat: {NO_TEMPLATE_FIX}")
