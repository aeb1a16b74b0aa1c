"""The [server] limits (profile_server.py) applied to one request's JSON before it is validated (LimitScreen), and
so before any work is queued for it.

Each check is cheap (counts and sizes) except the prompt's token count under an explicit max_prompt_tokens: a
prompt is tokenized only when its bytes could exceed it, and then in a worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferplug.errors import LimitExceeded, RequestError
from inferplug.profile_server import ServerOptions
from inferplug.server.error_json import error_response
from inferplug.stages.prompt_bound import check_text_fits

if TYPE_CHECKING:
    from inferplug.frontend.requests import Prepared

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


def _int(value: Any, default: int) -> int:
    """A count as sent, where it is one (a value of the wrong type is left for validation to name)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _check_common(raw: dict[str, Any], opts: ServerOptions, prompts: int, default_max_tokens: int) -> None:
    """n, stops and prompts x choices x max_tokens: the checks both endpoints share."""
    n = _int(raw.get("n"), 1)
    _check("n", n, "max_n", opts, "ask for fewer choices", "n")
    stops = [raw["stop"]] if isinstance(raw.get("stop"), str) else _list(raw.get("stop"))
    _check("the number of stop strings and stop_token_ids", len(stops) + len(_list(raw.get("stop_token_ids"))),
           "max_stop", opts, "send fewer stops", "stop")
    longest = max((len(s) for s in stops if isinstance(s, str)), default=0)
    _check("the longest stop string's length", longest, "max_stop_chars", opts, "send shorter stop strings", "stop")
    choices = _int(raw.get("beam_width"), 1) if raw.get("use_beam_search") is True else n
    max_tokens = _int(raw.get("max_completion_tokens"), 0) or _int(raw.get("max_tokens"), default_max_tokens)
    _check(f"prompts x choices x max_tokens ({prompts} x {choices} x {max_tokens})", prompts * choices * max_tokens,
           "max_total_tokens", opts, "lower max_tokens or n, or send fewer prompts", "max_tokens")


def _check_completion(raw: dict[str, Any], opts: ServerOptions, default_max_tokens: int) -> None:
    prompt = raw.get("prompt")
    batch = isinstance(prompt, list) and bool(prompt) and not isinstance(prompt[0], int)  # else one prompt
    prompts = len(prompt) if batch else 1
    _check("the number of prompts", prompts, "max_prompts", opts, "split the batch over several requests", "prompt")
    _check_common(raw, opts, prompts, default_max_tokens)


def _check_chat(raw: dict[str, Any], opts: ServerOptions, default_max_tokens: int) -> None:
    _check("the number of messages", len(_list(raw.get("messages"))), "max_messages", opts, "send a shorter history",
           "messages")
    tools = _list(raw.get("tools"))
    _check("the number of tools", len(tools), "max_tools", opts, "offer fewer tools", "tools")
    if tools:
        _check("the tools' JSON size in bytes", _json_bytes(tools), "max_schema_bytes", opts,
               "offer smaller tool schemas", "tools")
    if raw.get("response_format"):
        _check("the response_format's JSON size in bytes", _json_bytes(raw["response_format"]), "max_schema_bytes",
               opts, "send a smaller schema", "response_format")
    _check_common(raw, opts, 1, default_max_tokens)


CHECKS = {"/v1/completions": _check_completion, "/v1/chat/completions": _check_chat}


def _texts(raw: dict[str, Any]) -> tuple[str, list[list[str]]]:
    """The strings each prompt of a request is made of, as sent: a chat's contents, or each prompt's text."""
    if "messages" not in raw:
        prompt = raw.get("prompt")
        return "prompt", [[p] for p in (prompt if isinstance(prompt, list) else [prompt]) if isinstance(p, str)]
    parts = [m.get("content") for m in _list(raw["messages"]) if isinstance(m, dict)]
    parts = [c for p in parts for c in (p if isinstance(p, list) else [p])]
    return "messages", [[c if isinstance(c, str) else c.get("text") for c in parts
                         if isinstance(c, str) or (isinstance(c, dict) and isinstance(c.get("text"), str))]]


def check_fits(raw: dict[str, Any], backend: Any) -> None:
    """A prompt surely longer than the context, refused before it is validated, rendered or tokenized: a 7 MiB
    prompt costs its parse and no more (stages/prompt_bound.py's bound)."""
    tokenizer = getattr(backend, "tokenizer", None)
    if tokenizer is None:  # a remote server counts its own tokens
        return
    param, prompts = _texts(raw)
    for texts in prompts:
        check_text_fits(tokenizer, texts, backend.context_length, param)


def default_max_tokens(backend: Any) -> int:
    return backend.profile.sampling.max_tokens or backend.context_length


class LimitScreen:
    """The limits above, and the context's bound, on a generation request's JSON as sent, before FastAPI validates
    it: counting 20,000 messages is cheap, validating them to learn that they are too many costs ~90 ms of the GIL,
    which every stream's step waits on (issue 29). Runs behind BodySizeLimit, which hands the whole body over as one
    message."""

    def __init__(self, app: ASGIApp, state: Any):
        self.app, self.state = app, state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        check = CHECKS.get(scope.get("path", "")) if scope["type"] == "http" else None
        if check is None:
            return await self.app(scope, receive, send)
        message = await receive()
        try:
            raw = json.loads(message.get("body", b""))
        except ValueError:  # not JSON (or not UTF-8): FastAPI names the error
            raw = None
        if isinstance(raw, dict):
            try:
                check(raw, self.state.options, default_max_tokens(self.state.backend))
                check_fits(raw, self.state.backend)
            except RequestError as exc:
                self.state.metrics.failed(scope["path"], exc.status)
                code = exc.limit if isinstance(exc, LimitExceeded) else None
                return await error_response(str(exc), exc.status, exc.param, code)(scope, receive, send)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return message
            return await receive()

        await self.app(scope, replay, send)


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
