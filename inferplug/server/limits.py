"""The [server] limits (profile_server.py) applied to one parsed request, before any work is queued for it.

Each check is cheap (counts and sizes) except the prompt's token count under an explicit max_prompt_tokens: a
prompt is tokenized only when its bytes could exceed it, and then in a worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from inferplug.errors import LimitExceeded
from inferplug.profile_server import ServerOptions

if TYPE_CHECKING:
    from inferplug.frontend.requests import Prepared
    from inferplug.server.schemas import ChatCompletionRequest, CompletionRequest

_TEMPLATE_BYTES = 1024  # what a chat template may add around the messages' own JSON, in bytes (so tokens)


def over(what: str, value: int, key: str, limit: int, fix: str, param: str | None = None) -> LimitExceeded:
    flag = key.replace("_", "-")
    return LimitExceeded(f"{what} is {value}, over this server's limit of {limit}: {fix}. The operator sets the "
                         f"limit as [server] {key} in the profile (inferplug serve --{flag})", limit=key, param=param)


def _check(what: str, value: int, key: str, opts: ServerOptions, fix: str, param: str | None = None) -> None:
    limit = getattr(opts, key)
    if value > limit:
        raise over(what, value, key, limit, fix, param)


def _json_bytes(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False).encode())


def check_common(body: CompletionRequest | ChatCompletionRequest, opts: ServerOptions, prompts: int,
                 default_max_tokens: int) -> None:
    """n, stops and prompts x choices x max_tokens: the checks both endpoints share."""
    _check("n", body.n, "max_n", opts, "ask for fewer choices", "n")
    stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    _check("the number of stop strings and stop_token_ids", len(stops) + len(body.stop_token_ids or []),
           "max_stop", opts, "send fewer stops", "stop")
    longest = max((len(s) for s in stops), default=0)
    _check("the longest stop string's length", longest, "max_stop_chars", opts, "send shorter stop strings", "stop")
    choices = body.beam_width or 1 if body.use_beam_search else body.n
    max_tokens = getattr(body, "max_completion_tokens", None) or body.max_tokens or default_max_tokens
    _check(f"prompts x choices x max_tokens ({prompts} x {choices} x {max_tokens})", prompts * choices * max_tokens,
           "max_total_tokens", opts, "lower max_tokens or n, or send fewer prompts", "max_tokens")


def check_completion(body: CompletionRequest, opts: ServerOptions, default_max_tokens: int) -> None:
    prompts = body.prompts()
    _check("the number of prompts", len(prompts), "max_prompts", opts, "split the batch over several requests",
           "prompt")
    check_common(body, opts, len(prompts), default_max_tokens)


def check_chat(body: ChatCompletionRequest, opts: ServerOptions, default_max_tokens: int) -> None:
    _check("the number of messages", len(body.messages), "max_messages", opts, "send a shorter history", "messages")
    _check("the number of tools", len(body.tools or []), "max_tools", opts, "offer fewer tools", "tools")
    if body.tools:
        tools = [t.model_dump(exclude_none=True) for t in body.tools]
        _check("the tools' JSON size in bytes", _json_bytes(tools), "max_schema_bytes", opts,
               "offer smaller tool schemas", "tools")
    if body.response_format:
        _check("the response_format's JSON size in bytes", _json_bytes(body.response_format), "max_schema_bytes",
               opts, "send a smaller schema", "response_format")
    check_common(body, opts, 1, default_max_tokens)


async def check_prompt_tokens(backend: Any, prepared: list[Prepared], opts: ServerOptions) -> None:
    """Every prompt within [server] max_prompt_tokens. Unset, the backend's own context check bounds a prompt (the
    native engine tokenizes in its prompt stage, off the step thread), and nothing is tokenized here."""
    limit = opts.max_prompt_tokens
    if limit is None:
        return
    tokenizer = getattr(backend, "tokenizer", None)
    for p in prepared:
        request = p.request
        param = "messages" if request.messages is not None else "prompt"
        if isinstance(request.prompt, list):
            count = len(request.prompt)
        elif tokenizer is None:
            continue  # a remote server counts its own tokens
        elif request.prompt is not None:
            text = request.prompt
            count = len(text.encode()) if len(text.encode()) < limit else await asyncio.to_thread(
                lambda: len(tokenizer.encode(text)))
        else:
            size = _json_bytes(request.messages) + _json_bytes(request.tools or []) + _TEMPLATE_BYTES
            count = size if size < limit else await asyncio.to_thread(_chat_tokens, backend, request)
        if count > limit:
            raise over("the prompt's token count", count, "max_prompt_tokens", limit, "shorten the prompt", param)


def _chat_tokens(backend: Any, request: Any) -> int:
    text = backend.apply_chat_template(request.messages, request.tools)
    return len(backend.tokenizer.encode(text, add_special_tokens=False))
