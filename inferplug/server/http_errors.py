"""OpenAI-style error bodies, and the API key check every /v1 route depends on."""

from __future__ import annotations

import secrets
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from inferplug.errors import RequestError

_CODES = {401: "invalid_api_key", 404: "model_not_found", 413: "request_too_large"}


def error_body(message: str, status: int, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code or _CODES.get(status)}}


def error_response(message: str, status: int, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, status, param), status_code=status)


def check_api_key(request: Request) -> None:
    """401 unless the request carries the server's key (when it has one). The key is never echoed."""
    expected = request.app.state.api_key
    if expected is None:
        return
    given = request.headers.get("authorization", "")
    if not given.startswith("Bearer ") or not secrets.compare_digest(given[7:].encode(), expected.encode()):
        what = "wrong" if given else "missing"
        raise RequestError(f"the API key is {what}: send the server's key as 'Authorization: Bearer <key>'",
                           status=401)
