"""The endpoints: /v1/models, /v1/completions, /v1/chat/completions, /health and /metrics.

A generation is started (and bad input rejected with a 4xx) before any response byte is sent.
When the client disconnects, streaming or not, the generation is aborted and its KV blocks
are freed at once.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from inferplug.errors import RequestError
from inferplug.frontend.requests import Prepared, build_request
from inferplug.server.echo import make_echo
from inferplug.server.generation import Generation
from inferplug.server.http_errors import check_api_key, error_body
from inferplug.server.responses import ResponseBuilder
from inferplug.server.schemas import ChatCompletionRequest, CompletionRequest

router = APIRouter()
v1 = [Depends(check_api_key)]


@router.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/models", dependencies=v1)
async def models(request: Request) -> dict[str, Any]:
    backend = request.app.state.backend
    return {"object": "list", "data": [
        {"id": name, "object": "model", "created": 0, "owned_by": "inferplug", "max_model_len": backend.context_length}
        for name in served_names(backend)
    ]}


@router.post("/v1/completions", dependencies=v1)
async def completions(body: CompletionRequest, request: Request) -> Response:
    backend = _served(body, request)
    prepared = [build_request(backend, prompt=p, options=body.to_options()) for p in body.prompts()]
    echo = make_echo(backend.tokenizer, body.prompts(), body.n, body.prompt_only) if body.echo else None
    return await _generate("completion", body, prepared, request, body.logprobs is not None, echo=echo,
                           want_prompt_logprobs=body.prompt_logprobs is not None)


@router.post("/v1/chat/completions", dependencies=v1)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    backend = _served(body, request)
    tools = [t.model_dump(exclude_none=True) for t in body.tools or []]
    choice = body.tool_choice.model_dump() if hasattr(body.tool_choice, "model_dump") else body.tool_choice
    prepared = build_request(backend, messages=[m.as_dict() for m in body.messages], options=body.to_options(),
                             tools=tools, tool_choice=choice, parallel_tool_calls=body.parallel_tool_calls,
                             response_format=body.response_format)
    return await _generate("chat", body, [prepared], request, body.logprobs)


def served_names(backend: Any) -> list[str]:
    """The model names this server answers to: the served name first, then the profile's name."""
    return list(dict.fromkeys([backend.model_name, backend.profile.name]))


def _served(body: CompletionRequest | ChatCompletionRequest, request: Request) -> Any:
    """The backend, once the request names the model it serves."""
    backend = request.app.state.backend
    names = served_names(backend)
    if body.model not in names:
        raise RequestError(f"model {body.model!r} does not exist here; this server serves {', '.join(names)}",
                           param="model", status=404)
    return backend


async def _generate(kind: str, body: CompletionRequest | ChatCompletionRequest, prepared: list[Prepared],
                    request: Request, want_logprobs: bool, **builder_kw: Any) -> Response:
    backend = request.app.state.backend
    generation = Generation(backend, [p.request for p in prepared])
    n = prepared[0].request.params.n
    builder = ResponseBuilder(kind, body.model, len(prepared) * n, want_logprobs, prepared[0].tools or None,
                              prepared[0].parallel_tool_calls, **builder_kw)
    try:
        await generation.start()
    except BaseException:
        await generation.aclose()
        raise
    if body.stream:
        return _AbortingStream(_sse(generation, builder, body.include_usage, request),
                               media_type="text/event-stream")
    return await _whole(generation, builder, request)


async def _whole(generation: Generation, builder: ResponseBuilder, request: Request) -> Response:
    metrics = request.app.state.metrics
    errors: list[str] = []

    async def collect() -> None:
        async for event in generation.events():
            builder.add(event)
            if event.error:
                errors.append(event.error)

    collecting = asyncio.create_task(collect())
    leaving = asyncio.create_task(_until_disconnect(request))
    try:
        await asyncio.wait({collecting, leaving}, return_when=asyncio.FIRST_COMPLETED)
        if not collecting.done():  # the client left: nobody to answer
            metrics.failed(request.url.path, 499)
            return Response(status_code=499)
        collecting.result()
    finally:
        leaving.cancel()
        collecting.cancel()
        await generation.aclose()
    if errors:
        metrics.failed(request.url.path, 500)
        return JSONResponse(error_body(f"generation failed: {errors[0]}", 500), status_code=500)
    _observe(request, generation, builder)
    return JSONResponse(builder.response(generation.usage))


async def _sse(generation: Generation, builder: ResponseBuilder, include_usage: bool,
               request: Request) -> AsyncIterator[str]:
    finished = failed = False
    try:
        async for event in generation.events():
            if event.error:  # the error, then the choice's last chunk (finish_reason "error")
                failed = True
                yield _data(error_body(f"generation failed: {event.error}", 500))
            chunk = builder.chunk(event, include_usage)
            if chunk is not None:
                yield _data(chunk)
        if include_usage:
            yield _data(builder.usage_chunk(generation.usage))
        yield "data: [DONE]\n\n"
        finished = True
        if failed:
            request.app.state.metrics.failed(request.url.path, 500)
        else:
            _observe(request, generation, builder)
    finally:
        if not finished:  # the client left mid-stream (nginx's 499: client closed request)
            request.app.state.metrics.failed(request.url.path, 499)
        await generation.aclose()


def _observe(request: Request, generation: Generation, builder: ResponseBuilder) -> None:
    status = "aborted" if builder.aborted else "ok"
    request.app.state.metrics.observe(request.url.path, generation.usage, generation.started,
                                      generation.first_token_at, time.perf_counter(), status)


def _data(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def _until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


class _AbortingStream(StreamingResponse):
    """Closes its event stream however the response ends, so a vanished client's generation
    is aborted now rather than whenever the garbage collector finalizes the generator."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        import anyio

        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()  # type: ignore[union-attr]
