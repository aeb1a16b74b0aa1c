"""OpenAI's error shape, {"error": {"message", "type", "param", "code"}}, for every error the server answers."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from inferplug.errors import LimitExceeded, RequestError

_CODES = {401: "invalid_api_key", 403: "host_not_allowed", 404: "model_not_found", 408: "request_timeout",
          413: "request_too_large", 429: "rate_limit_exceeded"}


def error_body(message: str, status: int, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code or _CODES.get(status)}}


def error_response(message: str, status: int, param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, status, param, code), status_code=status, headers=headers)


def request_error_response(exc: RequestError) -> JSONResponse:
    """A RequestError's answer: a limit's key as the code, and Retry-After where it says when to retry."""
    if not isinstance(exc, LimitExceeded):
        return error_response(str(exc), exc.status, exc.param)
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after is not None else None
    return error_response(str(exc), exc.status, exc.param, exc.limit, headers)
