"""The HTTP side of `inferplug serve` with replicas: an ASGI app that hands each request to a replica.

It checks the Host and the API key first (server/guard.py), then reads the body (under the size limit and read
deadline), names the prompt for the router, and relays what the replica's
app sends. A client that leaves cancels the call, so the replica aborts its generation. A replica that dies
mid-request fails that request with a clear error (a 503 before the response began, an error event in a
stream); requests on the other replicas go on, and Serve routes new ones around it while Ray replaces it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.types import Receive, Scope, Send

from inferplug.profile_server import ServerOptions
from inferplug.server.error_json import error_body, error_response
from inferplug.server.guard import guarded
from inferplug.server.metrics_merge import merge_replica_metrics
from inferplug.server.replica_engine import RoutedRequest

_SCOPE_KEYS = ("type", "asgi", "http_version", "method", "scheme", "path", "raw_path", "query_string",
               "root_path", "headers", "client", "server")


def routing_text(body: bytes) -> str:
    """The text a prefix-aware router matches: the messages in order (system prompt first), or the prompt."""
    try:  # a body too deep to parse (RecursionError) is routed anyway: the replica's app answers its 400
        data = json.loads(body)
        if not isinstance(data, dict):
            return ""
        if isinstance(data.get("messages"), list):
            return "".join(_text(m.get("content")) for m in data["messages"] if isinstance(m, dict))
        return _prompt_text(data.get("prompt"))
    except (ValueError, RecursionError):
        return ""


def _prompt_text(prompt: Any) -> str:
    """A completion prompt: text, token ids (as text, so a shared id prefix is a shared text prefix), or a
    batch of either (its first)."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) for t in prompt):
            return " ".join(map(str, prompt))
        return _prompt_text(prompt[0])
    return ""


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


class ReplicaFront:
    def __init__(self, handle: Any, board: Any) -> None:
        self.handle = handle.options(stream=True)
        self.board = board

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # lifespan: nothing to start; the replicas are up before the server
        if scope["path"] == "/metrics":
            text = merge_replica_metrics(await self.board.collect.remote())
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", CONTENT_TYPE_LATEST.encode())]})
            return await send({"type": "http.response.body", "body": text})
        body = b""
        while (message := await receive())["type"] == "http.request":
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        else:
            return  # the client left before its body arrived
        prompt = routing_text(body) or f"{scope['method']} {scope['path']}"  # the router needs some text
        routed = RoutedRequest({k: scope[k] for k in _SCOPE_KEYS if k in scope}, body, prompt)
        await self._relay(self.handle.handle.remote(routed), receive, send)

    async def _relay(self, stream: Any, receive: Receive, send: Send) -> None:
        import ray

        leaving = asyncio.create_task(_until_disconnect(receive))
        started = streaming = False
        try:
            while True:
                step = asyncio.ensure_future(stream.__anext__())
                await asyncio.wait({step, leaving}, return_when=asyncio.FIRST_COMPLETED)
                if not step.done():  # the client left: the replica's app sees a disconnect and aborts
                    step.add_done_callback(_retrieve)
                    step.cancel()
                    stream.cancel()
                    return
                try:
                    message = step.result()
                except StopAsyncIteration:
                    return
                if message["type"] == "http.response.start":
                    started = True
                    streaming = any(k == b"content-type" and v.startswith(b"text/event-stream")
                                    for k, v in message["headers"])
                await send(message)
                if message["type"] == "http.response.body" and not message.get("more_body"):
                    async for _ in stream:  # the replica's end, whoever leaves now
                        pass
                    return
        except ray.exceptions.RayError as exc:
            await _fail(send, started, streaming, exc)
        finally:
            leaving.cancel()


def _retrieve(step: asyncio.Future) -> None:
    if not step.cancelled():
        step.exception()  # a cancelled call's RequestCancelledError: expected, not worth a log line


async def _fail(send: Send, started: bool, streaming: bool, exc: Exception) -> None:
    import ray

    died = isinstance(exc, (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError))
    message = ("the replica serving this request died; Ray Serve is replacing it, retry the request" if died
               else f"the replica failed this request ({type(exc).__name__}); see the Ray logs")
    if not started:
        return await error_response(message, 503)({"type": "http"}, _nothing, send)
    if streaming:  # an error event, as a generation error mid-stream is sent, then the end of the stream
        event = f"data: {json.dumps(error_body(message, 503))}\n\n".encode()
        await send({"type": "http.response.body", "body": event, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _nothing() -> dict[str, Any]:
    return {"type": "http.disconnect"}


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def create_front(handle: Any, board: Any, max_body_bytes: int, api_keys: tuple[str, ...] | None,
                 options: ServerOptions) -> Any:
    """The front behind the same guard as create_app's: a wrong key or a foreign Host is refused before a byte of the
    body is read or routed (each replica's app checks the key again)."""
    return guarded(ReplicaFront(handle, board), api_keys, options, max_body_bytes)
