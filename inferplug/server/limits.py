"""The [server] limits (profile_server.py), before any work is queued for a request: its nesting depth, the counts
of its lists and of its schemas' properties (and a prompt surely over the context) on its JSON as sent, before it is
validated (LimitScreen); its values (n, lengths, sizes, prompts x n x max_tokens) on the validated request, as
pydantic has read them (the routes).

Each check is cheap (counts and sizes) except the prompt's token count under an explicit max_prompt_tokens: a
prompt is tokenized only when its bytes could exceed it, and then in a worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from starlette.types import ASGIApp, Receive, Scope, Send

from inferplug.errors import LimitExceeded, RequestError
from inferplug.profile_server import ServerOptions
from inferplug.server.error_json import request_error_response
from inferplug.server.guard import replaying
from inferplug.stages.prompt_bound import check_text_fits

if TYPE_CHECKING:
    from inferplug.frontend.requests import Prepared
    from inferplug.server.schemas import ChatCompletionRequest, CompletionRequest

_TEMPLATE_BYTES = 1024  # what a chat template may add around the messages' own JSON, in bytes (so tokens)


def over(what: str, value: int, key: str, limit: int, fix: str, param: str | None = None) -> LimitExceeded:
    return LimitExceeded(f"{what} is {value}, over this server's limit of {limit}: {fix}. {_set_by(key)}", limit=key,
                         param=param)


def _set_by(key: str) -> str:
    return f"The operator sets the limit as [server] {key} in the profile (inferplug serve --{key.replace('_', '-')})"


def _too_deep_to_parse(opts: ServerOptions) -> LimitExceeded:
    """json.loads ran out of stack (a RecursionError): the body nests deeper than any limit lets through."""
    return LimitExceeded(f"the request body's JSON is nested too deep to parse, past this server's limit of "
                         f"{opts.max_json_depth} levels: send flatter JSON. {_set_by('max_json_depth')}",
                         limit="max_json_depth")


def _check(what: str, value: int, key: str, opts: ServerOptions, fix: str, param: str | None = None) -> None:
    limit = getattr(opts, key)
    if value > limit:
        raise over(what, value, key, limit, fix, param)


def _json_bytes(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False).encode())


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _shape(value: Any) -> tuple[int, int]:
    """(how deep the JSON value nests, in lists and objects; the properties of the schemas in it, as the keys of
    every "properties" object), walked without recursion: a value json.loads took may still be too deep for it."""
    depth, properties, stack = 0, 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        depth = max(depth, level)
        if isinstance(node, dict):
            inner = node.get("properties")
            properties += len(inner) if isinstance(inner, dict) else 0
            node = node.values()
        if not _CONTAINERS.isdisjoint(map(type, node)):  # at C speed: most lists hold only numbers or texts
            stack.extend((child, level + 1) for child in node if type(child) in _CONTAINERS)
    return depth, properties


_CONTAINERS = frozenset({dict, list})  # what json.loads makes of objects and arrays


# --- on the JSON as sent (LimitScreen): the counts of lists, costly to validate one item at a time -------------
def _count_prompts(raw: dict[str, Any]) -> int:
    """A completions body's prompts as sent: a list of texts or of id lists is a batch; a text or one list of ids
    (ints, or floats pydantic takes as ints) is one prompt."""
    prompt = raw.get("prompt")
    one = not isinstance(prompt, list) or not prompt or isinstance(prompt[0], (int, float))
    return 1 if one else len(prompt)


def _count_stops(raw: dict[str, Any]) -> int:
    stops = 1 if isinstance(raw.get("stop"), str) else len(_list(raw.get("stop")))
    return stops + len(_list(raw.get("stop_token_ids")))


def _counts_of_completion(raw: dict[str, Any], opts: ServerOptions) -> None:
    _check("the number of prompts", _count_prompts(raw), "max_prompts", opts, "split the batch over several requests",
           "prompt")


def _counts_of_chat(raw: dict[str, Any], opts: ServerOptions) -> None:
    _check("the number of messages", len(_list(raw.get("messages"))), "max_messages", opts, "send a shorter history",
           "messages")
    _check("the number of tools", len(_list(raw.get("tools"))), "max_tools", opts, "offer fewer tools", "tools")


def _schema_counts(raw: dict[str, Any], opts: ServerOptions) -> None:
    """The properties of what a chat compiles to grammars (after the depth check: its walk is the same)."""
    if isinstance(raw.get("response_format"), dict):
        _check("the number of properties in the response_format's schema", _shape(raw["response_format"])[1],
               "max_schema_properties", opts, "send a schema with fewer properties", "response_format")
    compiled = _compiled_tools(raw)
    if compiled:
        _check("the number of properties in the tools a required or named tool_choice compiles", _shape(compiled)[1],
               "max_schema_properties", opts, "offer tools with fewer parameters, or let tool_choice be auto", "tools")


def _compiled_tools(raw: dict[str, Any]) -> list[Any]:
    """The tools whose parameters become a grammar: all of them for a required call, the one a named tool_choice
    names; none under auto or none, which constrain nothing (frontend/requests.py's build_request)."""
    tools, choice = _list(raw.get("tools")), raw.get("tool_choice")
    if choice in ("required", "any", True):
        return tools
    named = choice.get("function") if isinstance(choice, dict) else None
    if not isinstance(named, dict):
        return []
    return [t for t in tools if isinstance(t, dict) and isinstance(t.get("function"), dict)
            and t["function"].get("name") == named.get("name")]


def _completion_texts(raw: dict[str, Any]) -> list[list[str]]:
    prompt = raw.get("prompt")
    return [[p] for p in (prompt if isinstance(prompt, list) else [prompt]) if isinstance(p, str)]


def _chat_texts(raw: dict[str, Any]) -> list[list[str]]:
    """The one prompt's strings: every message's content, a text or its parts' texts."""
    parts = [m.get("content") for m in _list(raw.get("messages")) if isinstance(m, dict)]
    parts = [c for p in parts for c in (p if isinstance(p, list) else [p])]
    return [[c if isinstance(c, str) else c["text"] for c in parts
             if isinstance(c, str) or (isinstance(c, dict) and isinstance(c.get("text"), str))]]


# path -> (its own counts, the strings of each of its prompts, the name of the field they are in)
SCREENS = {"/v1/completions": (_counts_of_completion, _completion_texts, "prompt"),
           "/v1/chat/completions": (_counts_of_chat, _chat_texts, "messages")}


def screen(path: str, raw: dict[str, Any], opts: ServerOptions, backend: Any) -> None:
    """The counts, and a prompt surely longer than the context, on the JSON as sent: before it is validated,
    rendered or tokenized, a 7 MiB prompt or 20,000 messages cost their parse and no more (stages/prompt_bound.py's
    bound for the context)."""
    counts, texts, param = SCREENS[path]
    counts(raw, opts)  # first: they refuse 20,000 messages without the depth walk over each (Python on the loop)
    _check("the number of stop strings and stop_token_ids", _count_stops(raw), "max_stop", opts, "send fewer stops",
           "stop")
    bias = raw.get("logit_bias")
    _check("the number of tokens in logit_bias", len(bias) if isinstance(bias, dict) else 0, "max_logit_bias", opts,
           "bias fewer tokens, or constrain the output with response_format", "logit_bias")
    _check("the request body's JSON nesting depth", _shape(raw)[0], "max_json_depth", opts,
           "it is nested too deep; send flatter JSON")
    if path == "/v1/chat/completions":
        _schema_counts(raw, opts)
    tokenizer = getattr(backend, "tokenizer", None)
    if tokenizer is None:  # a remote server counts its own tokens
        return
    for prompt in texts(raw):
        check_text_fits(tokenizer, prompt, backend.context_length, param)


# --- on the validated request (the routes): values, after pydantic has read them as it does ------------------------
def check_common(body: CompletionRequest | ChatCompletionRequest, opts: ServerOptions, prompts: int,
                 default_max_tokens: int) -> None:
    """n, the stops' length and prompts x choices x max_tokens: the checks both endpoints share."""
    _check("n", body.n, "max_n", opts, "ask for fewer choices", "n")
    stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    longest = max((len(s) for s in stops), default=0)
    _check("the longest stop string's length", longest, "max_stop_chars", opts, "send shorter stop strings", "stop")
    choices = body.beam_width or 1 if body.use_beam_search else body.n
    max_tokens = getattr(body, "max_completion_tokens", None) or body.max_tokens or default_max_tokens
    _check(f"prompts x choices x max_tokens ({prompts} x {choices} x {max_tokens})", prompts * choices * max_tokens,
           "max_total_tokens", opts, "lower max_tokens or n, or send fewer prompts", "max_tokens")


def check_completion(body: CompletionRequest, opts: ServerOptions, default_max_tokens: int) -> None:
    check_common(body, opts, len(body.prompts()), default_max_tokens)


def check_chat(body: ChatCompletionRequest, opts: ServerOptions, default_max_tokens: int) -> None:
    if body.tools:
        tools = [t.model_dump(exclude_none=True) for t in body.tools]
        _check("the tools' JSON size in bytes", _json_bytes(tools), "max_schema_bytes", opts,
               "offer smaller tool schemas", "tools")
    if body.response_format:
        _check("the response_format's JSON size in bytes", _json_bytes(body.response_format), "max_schema_bytes",
               opts, "send a smaller schema", "response_format")
    check_common(body, opts, 1, default_max_tokens)


def default_max_tokens(backend: Any) -> int:
    return backend.profile.sampling.max_tokens or backend.context_length


class LimitScreen:
    """`screen` on a generation request's JSON as sent, before FastAPI validates it: counting 20,000 messages is
    cheap, validating them to learn that they are too many costs ~90 ms of the GIL, which every stream's step waits
    on (issue 29). Runs behind BodySizeLimit, which hands the whole body over as one message."""

    def __init__(self, app: ASGIApp, state: Any):
        self.app, self.state = app, state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path not in SCREENS:
            return await self.app(scope, receive, send)
        message = await receive()
        try:
            raw = _parsed(message.get("body", b""), self.state.options)
            if isinstance(raw, dict):
                screen(path, raw, self.state.options, self.state.backend)
        except RequestError as exc:
            self.state.metrics.failed(path, exc.status)
            return await request_error_response(exc)(scope, receive, send)
        await self.app(scope, replaying(message, receive), send)


def _parsed(body: bytes, opts: ServerOptions) -> Any:
    """The body's JSON, or None where it is not JSON (or not UTF-8): FastAPI then names the error."""
    try:
        return json.loads(body)
    except RecursionError:
        raise _too_deep_to_parse(opts) from None
    except ValueError:
        return None


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
    text = backend.apply_chat_template(request.messages, request.tools, request.chat_template_kwargs)
    return len(backend.tokenizer.encode(text, add_special_tokens=False))
