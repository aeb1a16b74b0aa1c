"""The OpenAI-compatible app: `create_app(backend)` -> a FastAPI app serving that backend.

Errors are OpenAI-shaped JSON ({"error": {"message", "type", "param", "code"}}): bad input is a
4xx naming the field and the fix, and one bad request never disturbs the others.
"""

from __future__ import annotations

import json
import logging
import os
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferplug.errors import BackendUnavailable, InferPlugError, RequestError
from inferplug.server.http_errors import error_response
from inferplug.server.metrics import ServerMetrics

if TYPE_CHECKING:
    from inferplug.backends.base import Backend

log = logging.getLogger(__name__)

API_KEY_ENV = "INFERPLUG_API_KEY"
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024


def create_app(backend: Backend, *, api_key: str | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> FastAPI:
    """The app for one loaded backend. `api_key` (or INFERPLUG_API_KEY) makes /v1/* require it."""
    from inferplug.server.routes import router

    app = FastAPI(title="inferplug", version="1", docs_url=None, redoc_url=None)
    app.state.backend = backend
    app.state.api_key = api_key or os.environ.get(API_KEY_ENV) or None
    app.state.metrics = ServerMetrics(backend)
    app.include_router(router)

    @app.exception_handler(RequestError)
    async def _request_error(request: Request, exc: RequestError) -> JSONResponse:
        app.state.metrics.failed(request.url.path, exc.status)
        return error_response(str(exc), exc.status, exc.param)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        app.state.metrics.failed(request.url.path, 400)
        message, param = describe_validation_error(exc)
        return error_response(message, 400, param)

    @app.exception_handler(InferPlugError)
    async def _backend_error(request: Request, exc: InferPlugError) -> JSONResponse:
        status = 503 if isinstance(exc, BackendUnavailable) else 500  # not the request's fault
        app.state.metrics.failed(request.url.path, status)
        return error_response(str(exc), status)

    @app.exception_handler(Exception)
    async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
        # a bug, not bad input: the traceback goes to the log, never to the client
        log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        app.state.metrics.failed(request.url.path, 500)
        return error_response(f"internal error: {type(exc).__name__}; see the server log", 500)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(str(exc.detail), exc.status_code)

    app.add_middleware(BodySizeLimit, max_bytes=max_body_bytes)
    return app


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def describe_validation_error(exc: RequestValidationError) -> tuple[str, str | None]:
    """One line naming the first bad field and what was wrong with it."""
    errors = exc.errors()
    first = errors[0]
    if first.get("type") == "json_invalid":
        return f"the request body is not valid JSON ({first.get('ctx', {}).get('error', 'parse error')})", None
    path, tags = _split_loc(first.get("loc", ()))
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if not path:
        return f"the request body is invalid: {msg}", None
    if tags:  # a union field: pydantic reports one error per accepted type
        same_field = [_split_loc(e.get("loc", ())) for e in errors]
        accepted = [tags[0] for p, tags in same_field if tags and p.startswith(path)]
        msg = f"wrong type; use one of {', '.join(dict.fromkeys(accepted))}"
    if first.get("type") == "missing":
        return f"{path}: {msg}", path
    return f"{path}: {msg} (got {_shown(first.get('input'))})", path


def _split_loc(loc: tuple) -> tuple[str, list[str]]:
    """('body', 'prompt', 'list[int]') -> ('prompt', ['list[int]']): the field path and union type tags."""
    parts = [str(p) for p in loc if p != "body"]
    tags = [p for p in parts if p in _TYPE_TAGS or "[" in p]
    return ".".join(p for p in parts if p not in tags), tags


def _shown(value: Any) -> str:
    if isinstance(value, (int, float, str, bool, type(None))):
        return json.dumps(value)[:80]
    return type(value).__name__


class BodySizeLimit:
    """413 for bodies over `max_bytes`, whether declared in Content-Length or streamed in chunks."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._reject(scope, receive, send)
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left before sending its body
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_bytes:
                return await self._reject(scope, receive, send)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # later messages: the disconnect

        await self.app(scope, replay, send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(f"the request body is over the {self.max_bytes}-byte limit; send a smaller "
                                  "prompt", 413)
        await response(scope, receive, send)
