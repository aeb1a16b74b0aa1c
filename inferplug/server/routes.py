"""The endpoints: /v1/models, /v1/completions, /v1/chat/completions, /health, /metrics and /openapi.json.

A request is checked against the [server] limits (server/limits.py), then its generation is started (and bad
input rejected with a 4xx) before any response byte is sent. When the client disconnects, streaming or not, even
before its first token, the generation is aborted and its KV blocks are freed at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from inferplug.chat_template import template_variables
from inferplug.errors import RequestError
from inferplug.frontend.requests import Prepared, build_request
from inferplug.server.admission import until_disconnect
from inferplug.server.error_json import error_body
from inferplug.server.echo import make_echo
from inferplug.server.generation import Generation
from inferplug.server.limits import check_chat, check_completion, check_prompt_tokens, default_max_tokens
from inferplug.server.responses import ResponseBuilder
from inferplug.server.schemas import ChatCompletionRequest, CompletionRequest
from inferplug.server.tenants import cache_salt

log = logging.getLogger(__name__)
router = APIRouter()  # every path but /health needs the API key (server/guard.py), checked before the body is read


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    failure = request.app.state.backend.health()  # e.g. the engine's step thread died: a probe should restart us
    if failure is not None:
        return JSONResponse({"status": "unhealthy", "reason": failure}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/openapi.json", include_in_schema=False)
async def openapi(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())


@router.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    backend = request.app.state.backend
    return {"object": "list", "data": [
        {"id": name, "object": "model", "created": request.app.state.started, "owned_by": "inferplug",
         "max_model_len": backend.context_length}
        for name in served_names(backend)
    ]}


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request) -> Response:
    backend = _served(body, request)
    check_completion(body, request.app.state.options, default_max_tokens(backend))
    prepared = [build_request(backend, prompt=p, options=body.to_options()) for p in body.prompts()]
    echo = await asyncio.to_thread(make_echo, backend.tokenizer, body.prompts(), body.n, body.prompt_only) \
        if body.echo else None  # it tokenizes: off the event loop
    return await _generate("completion", body, prepared, request, body.logprobs is not None, echo=echo,
                           want_prompt_logprobs=body.prompt_logprobs is not None)


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    backend = _served(body, request)
    check_chat(body, request.app.state.options, default_max_tokens(backend))
    tools = [t.model_dump(exclude_none=True) for t in body.tools or []]
    choice = body.tool_choice.model_dump() if hasattr(body.tool_choice, "model_dump") else body.tool_choice
    prepared = build_request(backend, messages=[m.as_dict() for m in body.messages], options=body.to_options(),
                             tools=tools, tool_choice=choice, parallel_tool_calls=body.parallel_tool_calls,
                             response_format=body.response_format, chat_template_kwargs=template_variables(body.chat_template_kwargs, body.reasoning_effort))
    return await _generate("chat", body, [prepared], request, body.logprobs)


def served_names(backend: Any) -> list[str]:
    """The model names this server answers to: the served name first, then the profile's name."""
    return list(dict.fromkeys([backend.model_name, backend.profile.name]))


def _served(body: CompletionRequest | ChatCompletionRequest, request: Request) -> Any:
    """The backend, once the request names the model it serves."""
    backend = request.app.state.backend
    names = served_names(backend)
    body.model = body.model or names[0]
    if body.model not in names:
        raise RequestError(f"model {body.model!r} does not exist here; this server serves {', '.join(names)}",
                           param="model", status=404)
    return backend


async def _generate(kind: str, body: CompletionRequest | ChatCompletionRequest, prepared: list[Prepared],
                    request: Request, want_logprobs: bool, **builder_kw: Any) -> Response:
    backend = request.app.state.backend
    await check_prompt_tokens(backend, prepared, request.app.state.options)
    salt = cache_salt(request.headers, request.app.state.options, request.app.state.api_keys is not None)
    client = _client(request, salt)
    for p in prepared:
        p.request.cache_salt, p.request.client = salt, client
    generation = Generation(backend, [p.request for p in prepared])
    n = prepared[0].request.params.n
    builder = ResponseBuilder(kind, body.model, len(prepared) * n, want_logprobs, prepared[0].tools or None,
                              prepared[0].parallel_tool_calls, prepared[0].tool_required, **builder_kw)
    try:
        started = await request.app.state.admission.start(generation, request, client)
    except BaseException:
        await generation.aclose()
        raise
    if not started:  # the client left while it waited: aborted before its first token
        request.app.state.metrics.failed(request.url.path, 499)
        return Response(status_code=499)
    if body.stream:
        return _AbortingStream(_sse(generation, builder, body.include_usage, request), media_type="text/event-stream",
                               send_timeout=request.app.state.options.stream_send_timeout_s)
    return await _whole(generation, builder, request)


async def _whole(generation: Generation, builder: ResponseBuilder, request: Request) -> Response:
    metrics = request.app.state.metrics
    errors: list[str] = []
    generated = [0]  # tokens the engine gave, counted where no whole answer goes out

    async def collect() -> None:
        async for event in generation.events():
            builder.add(event)
            generated[0] += len(event.token_ids)
            if event.error:
                errors.append(event.error)

    collecting = asyncio.create_task(collect())
    leaving = asyncio.create_task(until_disconnect(request))
    try:
        await asyncio.wait({collecting, leaving}, return_when=asyncio.FIRST_COMPLETED)
        if not collecting.done():  # the client left: nobody to answer
            metrics.failed(request.url.path, 499, generated[0])
            return Response(status_code=499)
        collecting.result()
    finally:
        leaving.cancel()
        collecting.cancel()
        await generation.aclose()
    if errors:
        metrics.failed(request.url.path, 500, generated[0])
        return JSONResponse(_failure(request, errors[0]), status_code=500)
    _observe(request, generation, builder)
    return JSONResponse(builder.response(generation.usage))


async def _sse(generation: Generation, builder: ResponseBuilder, include_usage: bool,
               request: Request) -> AsyncIterator[str]:
    finished = failed = False
    generated = 0  # tokens the engine gave, counted where no whole answer goes out
    try:
        async for event in generation.events():
            generated += len(event.token_ids)
            if event.error:  # the error, then the choice's last chunk (finish_reason "error")
                failed = True
                yield _data(_failure(request, event.error))
            chunk = builder.chunk(event, include_usage)
            if chunk is not None:
                yield _data(chunk)
        if include_usage:
            yield _data(builder.usage_chunk(generation.usage))
        yield "data: [DONE]\n\n"
        finished = True
        if failed:
            request.app.state.metrics.failed(request.url.path, 500, generated)
        else:
            _observe(request, generation, builder)
    finally:
        if not finished:  # the client left mid-stream (nginx's 499: client closed request)
            request.app.state.metrics.failed(request.url.path, 499, generated)
        await generation.aclose()


def _client(request: Request, salt: str | None) -> str:
    """Who a request's waiting and its share of the engine's seats count for: its tenant (API key and [server]
    tenant_header, as its cache salt names it), else its remote address."""
    return f"tenant:{salt}" if salt else f"address:{request.client.host if request.client else '?'}"


def _failure(request: Request, error: str) -> dict[str, Any]:
    """The error body of a generation that failed: its details (paths, device errors) go to the log only."""
    log.error("generation failed on %s: %s", request.url.path, error)
    return error_body("generation failed (an internal error); the server log has the details", 500)


def _observe(request: Request, generation: Generation, builder: ResponseBuilder) -> None:
    status = "aborted" if builder.aborted else "ok"
    request.app.state.metrics.observe(request.url.path, generation.usage, generation.started,
                                      generation.first_token_at, time.perf_counter(), status)


def _data(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


class _AbortingStream(StreamingResponse):
    """Closes its event stream however the response ends, so a vanished client's generation
    is aborted now rather than whenever the garbage collector finalizes the generator. A client that stops
    reading (its socket full) for `send_timeout` seconds is cut off, and its generation aborted, the same way."""

    def __init__(self, content: AsyncIterator[str], *, media_type: str, send_timeout: float):
        super().__init__(content, media_type=media_type)
        self.send_timeout = send_timeout

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        import anyio

        async def bounded_send(message: Any) -> None:
            with anyio.fail_after(self.send_timeout):
                await send(message)

        try:
            await super().__call__(scope, receive, bounded_send)
        except TimeoutError:
            log.info("a client read nothing of its stream for %g s ([server] stream_send_timeout_s): cut off",
                     self.send_timeout)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()  # type: ignore[union-attr]
