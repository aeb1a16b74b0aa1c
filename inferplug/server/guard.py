"""What every HTTP request passes before the app sees it: the Host check, the API key, then the body under a size
cap and a read deadline. Each check answers an OpenAI-shaped error without reading more than it must: a request
with a wrong key or a foreign Host is refused before a byte of its body is read."""

from __future__ import annotations

import asyncio
import ipaddress
import secrets

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferplug.profile_server import ServerOptions
from inferplug.server.error_json import error_response

OPEN_PATHS = ("/health",)  # a load balancer's probe needs no key
_LOOPBACK_NAMES = {"localhost", "localhost.localdomain"}


def _is_loopback(host: str) -> bool:
    if host.lower() in _LOOPBACK_NAMES or host.lower().endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_name(header: str) -> str:
    """The name in a Host header, without its port ('[::1]:8000' -> '::1', 'a.b:80' -> 'a.b')."""
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def parse_api_keys(value: str | None) -> tuple[str, ...] | None:
    """The server's keys from --api-key or INFERPLUG_API_KEY: comma-separated, one per tenant (None: no key)."""
    return tuple(k.strip() for k in (value or "").split(",") if k.strip()) or None


def guarded(app: ASGIApp, api_keys: tuple[str, ...] | None, options: ServerOptions, max_body_bytes: int) -> ASGIApp:
    """`app` behind the Host and key checks, then the body limits: create_app's middleware, for a bare ASGI app (the
    replica front, which must refuse a request before it reads the body it would route)."""
    limited = BodySizeLimit(app, max_bytes=max_body_bytes, read_timeout=options.body_read_timeout_s,
                            max_values=options.max_json_values)
    return RequestGuard(limited, api_keys=api_keys, allowed_hosts=options.allowed_hosts)


def key_problem(authorization: str, expected: tuple[str, ...] | None) -> str | None:
    """Why the Authorization header carries none of the server's keys (None: it does, or there are none)."""
    if expected is None:
        return None
    given = authorization.removeprefix("Bearer ").encode() if authorization.startswith("Bearer ") else None
    # every key compared, in constant time each: which one matched is not told by the time taken
    if given is not None and sum(secrets.compare_digest(given, key.encode()) for key in expected):
        return None
    what = "wrong" if authorization else "missing"
    return f"the API key is {what}: send the server's key as 'Authorization: Bearer <key>'"


SINGLE_HEADERS = ("authorization", "host")  # the guard's verdict holds only if every later reader sees the same one


class RequestGuard:
    """403 for a foreign Host header on a loopback server without a key (DNS rebinding: a web page's script
    reaching 127.0.0.1 through a name it controls), 401 for a missing or wrong key, 400 for a second Authorization
    or Host header (the key is checked on one, the tenant salted by another); /health stays open."""

    def __init__(self, app: ASGIApp, api_keys: tuple[str, ...] | None, allowed_hosts: list[str]):
        self.app, self.api_keys = app, api_keys
        self.allowed_hosts = {h.lower() for h in allowed_hosts}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        pairs = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope.get("headers", [])]
        headers = dict(pairs)
        twice = next((name for name in SINGLE_HEADERS if sum(k == name for k, _ in pairs) > 1), None)
        if twice is not None:  # checked here, read elsewhere (the tenant salt): a second copy could differ
            return await error_response(f"the request has more than one {twice.title()} header: send one",
                                        400)(scope, receive, send)
        problem, status = self._host_problem(scope, headers.get("host")), 403
        if problem is None and scope.get("path") not in OPEN_PATHS:
            problem, status = key_problem(headers.get("authorization", ""), self.api_keys), 401
        if problem is not None:
            return await error_response(problem, status)(scope, receive, send)
        await self.app(scope, receive, send)

    def _host_problem(self, scope: Scope, host_header: str | None) -> str | None:
        if self.api_keys is not None or "*" in self.allowed_hosts or host_header is None:
            return None
        local = (scope.get("server") or ("", 0))[0]  # the address the connection arrived on
        if not _is_loopback(str(local)):
            return None  # it arrived on an address the operator chose to expose
        name = _host_name(host_header).lower()
        if _is_loopback(name) or name in self.allowed_hosts:
            return None
        return (f"the Host header {name!r} does not name this machine: over loopback, a server without an API key "
                "answers only loopback names (a guard against DNS rebinding). Add the name to [server] "
                "allowed_hosts (or --allowed-host), or set an API key")


def replaying(message: Message, receive: Receive) -> Receive:
    """A receive that gives the body message already read first, then the connection's own (the disconnect)."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return message
        return await receive()

    return replay


class BodySizeLimit:
    """413 for a body over `max_bytes`, declared in Content-Length or streamed in chunks, or with more than
    `max_values` commas (an upper bound on its JSON values, counted at C speed without parsing: json.loads and
    validation of millions of values hold the GIL for seconds, and every stream with it); 408 for a body that takes
    longer than `read_timeout` to arrive (a slow client holding a connection open)."""

    def __init__(self, app: ASGIApp, max_bytes: int, read_timeout: float = 30.0, max_values: int | None = None):
        self.app, self.max_bytes, self.read_timeout, self.max_values = app, max_bytes, read_timeout, max_values

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._too_large(scope, receive, send)
        chunks, size, more = [], 0, True
        deadline = asyncio.get_running_loop().time() + self.read_timeout
        while more:
            try:
                message = await asyncio.wait_for(receive(), deadline - asyncio.get_running_loop().time())
            except TimeoutError:
                message = f"the request body did not arrive within {self.read_timeout:g} s ([server] body_read_timeout_s)"
                return await error_response(message, 408)(scope, receive, send)
            if message["type"] != "http.request":
                return  # the client left before sending its body
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > self.max_bytes:
                return await self._too_large(scope, receive, send)
        body = b"".join(chunks)  # one copy: the chunks, then the whole body, never a body that grows
        # the values are about its commas, and its lists and objects (each costs the parse and the depth walk), at most
        # max_values of either: counted at C speed
        if self.max_values is not None and len(body) > self.max_values and max(
                body.count(b","), body.count(b"[") + body.count(b"{")) > self.max_values:
            message = (f"the request body holds over {self.max_values} JSON values, this server's limit ([server] "
                       "max_json_values, --max-json-values): send fewer prompts or shorter token-id lists")
            return await error_response(message, 413, code="max_json_values")(scope, receive, send)
        await self.app(scope, replaying({"type": "http.request", "body": body, "more_body": False}, receive), send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = f"the request body is over the {self.max_bytes}-byte limit; send a smaller prompt (--max-body-bytes)"
        await error_response(message, 413)(scope, receive, send)
