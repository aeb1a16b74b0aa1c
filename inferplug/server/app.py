"""The OpenAI-compatible app: `create_app(backend)` -> a FastAPI app serving that backend.

Errors are OpenAI-shaped JSON ({"error": {"message", "type", "param", "code"}}): bad input is a
4xx naming the field and the fix, and one bad request never disturbs the others.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from inferplug.errors import BackendUnavailable, InferPlugError, RequestError
from inferplug.profile_server import ServerOptions
from inferplug.server.admission import Admission
from inferplug.server.error_json import error_body, error_response, request_error_response
from inferplug.server.guard import BodySizeLimit, RequestGuard, parse_api_keys
from inferplug.server.limits import LimitScreen
from inferplug.server.metrics import ServerMetrics

__all__ = ["BodySizeLimit", "create_app", "error_body", "error_response"]  # the replica front's imports too

if TYPE_CHECKING:
    from inferplug.backends.base import Backend

log = logging.getLogger(__name__)

API_KEY_ENV = "INFERPLUG_API_KEY"
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024


def create_app(backend: Backend, *, api_key: str | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               options: ServerOptions | None = None) -> FastAPI:
    """The app for one loaded backend. `api_key` (or INFERPLUG_API_KEY) makes every path but /health require it
    (several keys, comma-separated: one per tenant, whose cached prompts are kept apart, server/tenants.py);
    `options`: the limits (default: the backend's profile's [server] table)."""
    from inferplug.server.routes import router

    app = FastAPI(title="inferplug", version="1", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.backend = backend
    app.state.started = int(time.time())  # /v1/models' "created": when this server loaded the model
    app.state.api_keys = parse_api_keys(api_key or os.environ.get(API_KEY_ENV))
    app.state.options = options or getattr(getattr(backend, "profile", None), "server", None) or ServerOptions()
    app.state.metrics = ServerMetrics(backend)
    app.state.admission = Admission(app.state.options)
    app.include_router(router)

    @app.exception_handler(RequestError)
    async def _request_error(request: Request, exc: RequestError) -> JSONResponse:
        app.state.metrics.failed(request.url.path, exc.status)
        return request_error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        app.state.metrics.failed(request.url.path, 400)
        message, param = describe_validation_error(exc)
        return error_response(message, 400, param)

    @app.exception_handler(InferPlugError)
    async def _backend_error(request: Request, exc: InferPlugError) -> JSONResponse:
        if isinstance(exc, BackendUnavailable):  # our own message, naming the fix: not the request's fault
            app.state.metrics.failed(request.url.path, 503)
            return error_response(str(exc), 503)
        return _internal(request, exc)

    @app.exception_handler(Exception)
    async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
        return _internal(request, exc)

    def _internal(request: Request, exc: Exception) -> JSONResponse:
        # a bug or a backend failure, not bad input: the details (paths, device errors) go to the log, never
        # to the client
        log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        app.state.metrics.failed(request.url.path, 500)
        return error_response(f"internal error: {type(exc).__name__}; see the server log", 500)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:  # no such route (a missing model is a RequestError): say what is served
            return error_response(f"{request.method} {request.url.path} is not served here: this server answers "
                                  f"{SERVED}", 404, code="not_found")
        return error_response(str(exc.detail), exc.status_code)

    opts = app.state.options
    app.add_middleware(LimitScreen, state=app.state)  # runs last of the three, on the body BodySizeLimit read
    app.add_middleware(BodySizeLimit, max_bytes=max_body_bytes, read_timeout=opts.body_read_timeout_s,
                       max_values=opts.max_json_values)
    app.add_middleware(RequestGuard, api_keys=app.state.api_keys, allowed_hosts=opts.allowed_hosts)  # runs first
    return app


SERVED = ("POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health and GET /metrics (text "
          "generation: no embeddings, audio or images)")
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
