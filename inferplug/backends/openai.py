"""The remote backend: any OpenAI-compatible server (`inferplug serve`, vLLM, OpenAI) over httpx.

Every request streams (SSE). Connection errors, 429 and 5xx are retried with exponential
backoff, but only until the first token arrived: after that a retry would repeat text the
caller already has, so the choice ends with an error event instead. The API key comes from the
environment variable the profile names; it is sent as a header and kept out of every message.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from inferplug.backends.base import Backend
from inferplug.backends.openai_sse import FinishHolder, chunk_events, chunk_usage, sse_data
from inferplug.errors import BackendUnavailable, RequestError
from inferplug.types import Capabilities, Event, Request, SamplingParams, Timings

if TYPE_CHECKING:
    import httpx

    from inferplug.profile import Profile
    from inferplug.plan import Plan

RETRY_STATUSES = {429, 500, 502, 503, 504}
_BACKOFF_S = 0.5
_MAX_RETRY_AFTER_S = 30.0


class OpenAIBackend(Backend):
    name = "openai"

    def __init__(self, profile: Profile, plan: Plan) -> None:
        super().__init__(profile, plan)
        try:
            import httpx
        except ImportError as exc:
            raise BackendUnavailable(
                f"the openai backend needs httpx ({exc}); pip install 'inferplug[openai]'"
            ) from exc
        opts = profile.openai
        self.base_url = opts.base_url.rstrip("/")
        self._key = opts.api_key.get_secret_value() if opts.api_key else os.environ.get(opts.api_key_env) or None
        self._timeout = httpx.Timeout(opts.timeout, connect=min(opts.timeout, 10.0))
        self._clients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}  # httpx clients are per loop
        self._active: dict[str, httpx.Response | None] = {}
        self._aborted: set[str] = set()
        # what the profile leaves out is asked of the server (GET /models) when first needed: by the first request,
        # or the first look at model_name / context_length; never at load, so a profile that is only loaded
        # (resolve, doctor, a front end's construction) sends nothing, the key least of all
        self._model, self._context = opts.model or profile.model.served_name, profile.model.context_length
        self._listed = self._model is not None and self._context is not None

    # --- protocol -------------------------------------------------------------------
    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(n=True, tools=True, json_schema=True)

    @property
    def model_name(self) -> str:
        if self._model is None:
            self._read_model_list_now()
        return self._model

    @property
    def announced_name(self) -> str:
        return self._model or self.profile.name  # the server is not asked (with the key) before a client's request

    @property
    def context_length(self) -> int:
        if self._context is None and not self._listed:
            self._read_model_list_now()
        return self._context or self.plan.max_model_len or 0

    def apply_chat_template(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                            template_kwargs: dict[str, Any] | None = None) -> str:
        raise BackendUnavailable("the openai backend renders chats on the remote server; send messages instead")

    async def generate(self, request: Request) -> AsyncIterator[Event]:
        if not self._listed:
            await self._read_model_list()
        path, body = self._body(request)
        started = time.perf_counter()
        first_token: float | None = None
        holder, finished, usage = FinishHolder(), set(), None
        self._active[request.request_id] = None
        try:
            async with self._stream(request.request_id, path, body) as response:
                try:
                    async for chunk in sse_data(response.aiter_lines()):
                        if request.request_id in self._aborted:  # aborted while the stream was opening
                            raise _StreamError("aborted")
                        if "error" in chunk:
                            raise _StreamError(_error_message(chunk, self._key))
                        usage = chunk_usage(chunk) or usage
                        for event in chunk_events(request.request_id, chunk):
                            first_token = first_token or (time.perf_counter() if event.text or event.tool_calls else None)
                            if event.finish_reason is not None:
                                finished.add(event.index)
                            if (out := holder.pass_through(event)) is not None:
                                yield out
                except (_StreamError, *_transport_errors()) as exc:  # no retry once tokens flowed
                    aborted = request.request_id in self._aborted
                    error = None if aborted else _redact(str(exc) or type(exc).__name__, self._key)
                    for index in sorted(set(range(request.params.n)) - finished):
                        ended = Event(request.request_id, index, finish_reason="abort" if aborted else "error",
                                      error=error)
                        if (out := holder.pass_through(ended)) is not None:
                            yield out
            last = holder.release(usage)
            if last is not None:
                ttft = None if first_token is None else first_token - started
                last.timings = Timings(ttft=ttft, e2e=time.perf_counter() - started)
                yield last
        finally:
            self._active.pop(request.request_id, None)
            self._aborted.discard(request.request_id)

    async def abort(self, request_id: str) -> None:
        if request_id in self._active:
            self._aborted.add(request_id)
            response = self._active[request_id]
            if response is not None:
                await response.aclose()

    def close(self) -> None:
        clients, self._clients = list(self._clients.items()), {}
        for loop, client in clients:
            if not loop.is_closed() and loop.is_running():
                asyncio.run_coroutine_threadsafe(client.aclose(), loop)
        super().close()

    # --- HTTP -----------------------------------------------------------------------
    def _client(self) -> httpx.AsyncClient:
        import httpx

        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = self._clients[loop] = httpx.AsyncClient(base_url=self.base_url, timeout=self._timeout,
                                                             headers=self._headers())
        return client

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._key}"} if self._key else {}

    @asynccontextmanager
    async def _stream(self, request_id: str, path: str, body: dict[str, Any]) -> AsyncIterator[httpx.Response]:
        response = await self._send_with_retries(path, body)
        self._active[request_id] = response  # abort() closes it
        try:
            yield response
        finally:
            await response.aclose()

    async def _send_with_retries(self, path: str, body: dict[str, Any]) -> httpx.Response:
        """The streaming response once its status is 200; retries happen before any token."""
        import httpx

        client = self._client()
        retries = self.profile.openai.max_retries
        for attempt in range(retries + 1):
            wait = _BACKOFF_S * 2**attempt
            try:
                response = await client.send(client.build_request("POST", path, json=body), stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.ReadTimeout, httpx.RemoteProtocolError) as exc:
                if attempt == retries:
                    raise BackendUnavailable(f"cannot reach {self.base_url}{path} after {retries + 1} tries "
                                             f"({type(exc).__name__}); is the server running?") from None
            else:
                if response.status_code == 200:
                    return response
                await response.aread()
                await response.aclose()
                if response.status_code not in RETRY_STATUSES or attempt == retries:
                    raise _http_error(response, self._key)
                wait = max(wait, min(_retry_after(response), _MAX_RETRY_AFTER_S))
            await asyncio.sleep(wait)
        raise AssertionError("unreachable")

    async def _read_model_list(self) -> None:
        """The first served model and its context, from GET /models, for what the profile leaves out."""
        import httpx

        try:
            self._take_model_list(await self._client().get("/models"))
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None

    def _read_model_list_now(self) -> None:
        """_read_model_list for a caller outside an event loop (a property)."""
        import httpx

        try:
            self._take_model_list(httpx.get(f"{self.base_url}/models", headers=self._headers(), timeout=self._timeout))
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None

    def _unreachable(self, exc: Exception) -> BackendUnavailable:
        return BackendUnavailable(f"cannot reach {self.base_url}/models ({type(exc).__name__}); start the server "
                                  "or set [openai] model and [model] context_length in the profile")

    def _take_model_list(self, reply: httpx.Response) -> None:
        if reply.status_code != 200:
            detail = _redact(reply.text[:200], self._key)
            key = "the api_key given" if self.profile.openai.api_key else self.profile.openai.api_key_env
            raise BackendUnavailable(f"{self.base_url}/models answered {reply.status_code}: {detail}. "
                                     f"Check the URL and {key}")
        models = reply.json().get("data") or []
        if not models:
            raise BackendUnavailable(f"{self.base_url}/models lists no model; set [openai] model in the profile")
        chosen = next((m for m in models if m.get("id") == self._model), models[0])
        self._model = self._model or chosen["id"]
        self._context = self._context or chosen.get("max_model_len")
        self._listed = True

    def _body(self, request: Request) -> tuple[str, dict[str, Any]]:
        p = request.params
        body: dict[str, Any] = {"model": self._model, "stream": True, "stream_options": {"include_usage": True},
                                **_sampling_fields(p)}
        if request.documents is not None:
            raise RequestError("document cache hints are not sent to a remote server; drop `documents`",
                               param="documents")
        if request.messages is not None:
            body["messages"] = request.messages
            body.update(_tool_fields(request))
            if p.logprobs is not None:
                body.update(logprobs=True, top_logprobs=p.logprobs)
            if (response_format := _response_format(request)) is not None:
                body["response_format"] = response_format
            if request.chat_template_kwargs:  # vLLM's and our server's extension; a server without it ignores it
                body["chat_template_kwargs"] = request.chat_template_kwargs
            return "/chat/completions", body
        if p.json_schema is not None:
            raise RequestError("json_schema needs chat messages on the openai backend", param="json_schema")
        body["prompt"] = request.prompt
        if p.logprobs is not None:
            body["logprobs"] = p.logprobs
        return "/completions", body


def _tool_fields(request: Request) -> dict[str, Any]:
    """tools, tool_choice and parallel_tool_calls as the request gives them: the remote server constrains a
    required call itself."""
    if not request.tools:
        return {}
    fields = {"tools": request.tools, "tool_choice": request.tool_choice,
              "parallel_tool_calls": request.parallel_tool_calls}
    return {k: v for k, v in fields.items() if v is not None}


def _response_format(request: Request) -> dict[str, Any] | None:
    """The response_format asked for; else the JSON schema, unless it only constrains a required tool call."""
    if request.response_format is not None:
        return request.response_format
    schema, forced = request.params.json_schema, request.tool_choice not in (None, "auto")
    return None if schema is None or forced else {"type": "json_schema",
                                                   "json_schema": {"name": "output", "schema": schema}}


def _sampling_fields(p: SamplingParams) -> dict[str, Any]:
    """OpenAI's fields, plus vLLM's extra ones only when they differ from their defaults."""
    fields: dict[str, Any] = {"n": p.n, "temperature": p.temperature, "top_p": p.top_p}
    if p.max_tokens is not None:
        fields["max_tokens"] = p.max_tokens
    for name in ("seed",):
        if getattr(p, name) is not None:
            fields[name] = getattr(p, name)
    defaults = SamplingParams()
    for name in ("stop", "presence_penalty", "frequency_penalty", "top_k", "min_p", "repetition_penalty",
                 "min_tokens", "ignore_eos", "stop_token_ids", "include_stop_str_in_output"):
        if getattr(p, name) != getattr(defaults, name):
            fields[name] = getattr(p, name)
    if p.logit_bias:
        fields["logit_bias"] = {str(t): bias for t, bias in p.logit_bias.items()}  # JSON keys
    return fields


class _StreamError(Exception):
    """The server sent an error in the middle of a stream."""


def _transport_errors() -> tuple[type[Exception], ...]:
    import httpx

    return (httpx.TransportError, httpx.StreamError)


def _retry_after(response: httpx.Response) -> float:
    try:
        return float(response.headers.get("retry-after", 0))
    except ValueError:
        return 0.0


def _redact(text: str, key: str | None) -> str:
    return text.replace(key, "***") if key else text


def _error_message(payload: dict[str, Any], key: str | None) -> str:
    error = payload.get("error")
    message = error.get("message") if isinstance(error, dict) else str(error)
    return _redact(str(message), key)


def _http_error(response: httpx.Response, key: str | None) -> Exception:
    """A 4xx is the request's fault (RequestError, same status); anything else is the server's."""
    try:
        payload = response.json()
        message, param = _error_message(payload, key), (payload.get("error") or {}).get("param")
    except ValueError:
        message, param = _redact(response.text[:300], key), None
    where = f"{response.request.url.copy_with(query=None)}"
    if 400 <= response.status_code < 500:
        return RequestError(f"the remote server rejected the request ({response.status_code}): {message}",
                            param=param, status=response.status_code)
    return BackendUnavailable(f"{where} failed with {response.status_code}: {message}")
