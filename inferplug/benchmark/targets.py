"""Where benchmark requests go: an in-process Backend, or an OpenAI-compatible HTTP endpoint.

Both stream, and both time each request the same way on the client side: start before the
request is handed over, one timestamp per chunk that carries content, end at the last event.
"""

from __future__ import annotations

import json
import time
from typing import Any, Protocol

from inferplug.benchmark.datasets import BenchRequest
from inferplug.benchmark.metrics import RequestRecord
from inferplug.errors import InferPlugError
from inferplug.types import Request, SamplingParams


class Target(Protocol):
    name: str

    async def send(self, item: BenchRequest, clock_origin: float) -> RequestRecord: ...


class BackendTarget:
    """Requests go straight into a loaded Backend through its protocol (no HTTP in the way)."""

    def __init__(self, backend: Any, ignore_eos: bool = False) -> None:
        self.backend = backend
        self.ignore_eos = ignore_eos
        self.name = f"{backend.name}:{backend.model_name}"

    async def send(self, item: BenchRequest, clock_origin: float) -> RequestRecord:
        params = SamplingParams(temperature=0.0, max_tokens=item.output_len, ignore_eos=self.ignore_eos)
        request = Request(prompt=item.prompt_ids or item.prompt, params=params, documents=item.documents)
        record = RequestRecord(prompt_len=item.prompt_len, start=time.perf_counter() - clock_origin)
        tokens = 0
        try:
            async for event in self.backend.generate(request):
                if event.finish_reason == "error" or event.error:
                    record.error = event.error or "the backend reported an error"
                    break
                if event.text or event.token_ids:
                    record.chunk_times.append(time.perf_counter() - clock_origin)
                    tokens += len(event.token_ids)
                if event.usage is not None:
                    record.prompt_len = event.usage.prompt_tokens or record.prompt_len
                    record.cached_tokens = event.usage.cached_tokens
                    tokens = event.usage.completion_tokens or tokens
            else:
                record.success = bool(record.chunk_times)
                record.error = "" if record.success else "the stream ended without any output"
        except Exception as exc:  # one failed request is recorded, the run goes on
            record.error = f"{type(exc).__name__}: {exc}"
        record.end = time.perf_counter() - clock_origin
        record.output_len = tokens or len(record.chunk_times)
        return record


def normalize_base_url(url: str) -> str:
    """`http://host:8000` or `http://host:8000/v1/` -> `http://host:8000/v1`."""
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise InferPlugError(f"--url {url!r} is invalid: give an http(s) URL such as http://127.0.0.1:8000/v1")
    return url if url.endswith("/v1") else url + "/v1"


class OpenAITarget:
    """Streaming `/v1/completions` over SSE: our server, vLLM's, or llama.cpp's."""

    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None,
                 ignore_eos: bool = False, timeout: float = 600.0) -> None:
        import httpx

        self.base_url = normalize_base_url(base_url)
        self.model = model
        self.ignore_eos = ignore_eos
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(headers=headers, timeout=timeout, limits=httpx.Limits(max_connections=None))
        self.name = f"openai:{self.base_url}"

    async def check(self) -> None:
        """Reach the server and pick its model before any load is sent; a clear error if we can't."""
        import httpx

        try:
            response = await self._client.get(f"{self.base_url}/models", timeout=10.0)
            response.raise_for_status()
            models = [m["id"] for m in response.json().get("data", [])]
        except httpx.HTTPStatusError as exc:
            raise InferPlugError(
                f"{self.base_url}/models answered {exc.response.status_code}: check the URL and --api-key"
            ) from None
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            raise InferPlugError(
                f"cannot reach an OpenAI-compatible server at {self.base_url} ({type(exc).__name__}: {exc}); "
                "start it (e.g. `inferplug serve PROFILE`) or fix --url"
            ) from None
        if self.model is None:
            if not models:
                raise InferPlugError(f"{self.base_url}/models lists no model: pass --model NAME")
            self.model = models[0]
        self.name = f"openai:{self.model}@{self.base_url}"

    async def send(self, item: BenchRequest, clock_origin: float) -> RequestRecord:
        body = {
            "model": self.model, "prompt": item.prompt, "max_tokens": item.output_len, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True},
        }
        if self.ignore_eos:  # a vLLM/llama.cpp extension: sent only when asked, strict servers reject it
            body["ignore_eos"] = True
        record = RequestRecord(prompt_len=item.prompt_len, start=time.perf_counter() - clock_origin)
        usage: dict[str, Any] | None = None
        try:
            async with self._client.stream("POST", f"{self.base_url}/completions", json=body) as response:
                if response.status_code != 200:
                    text = (await response.aread()).decode(errors="replace")
                    raise InferPlugError(f"HTTP {response.status_code}: {text[:300]}")
                async for line in response.aiter_lines():
                    data = line.removeprefix("data:").strip() if line.startswith("data:") else ""
                    if not data or data == "[DONE]":
                        continue
                    chunk = json.loads(data)
                    if chunk.get("error"):
                        raise InferPlugError(str(chunk["error"]))
                    if any(_carries_tokens(c) for c in chunk.get("choices") or []):
                        record.chunk_times.append(time.perf_counter() - clock_origin)
                    usage = chunk.get("usage") or usage
            record.success = bool(record.chunk_times)
            record.error = "" if record.success else "the stream ended without any output"
        except Exception as exc:  # one failed request is recorded, the run goes on
            record.error = f"{type(exc).__name__}: {exc}"
        record.end = time.perf_counter() - clock_origin
        record.output_len = len(record.chunk_times)
        if usage:
            record.prompt_len = usage.get("prompt_tokens") or record.prompt_len
            record.output_len = usage.get("completion_tokens") or record.output_len
            record.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        return record

    async def aclose(self) -> None:
        await self._client.aclose()


def _carries_tokens(choice: dict[str, Any]) -> bool:
    """A chunk with text, or without text but not final (a token whose bytes don't decode yet)."""
    return bool(choice.get("text")) or choice.get("finish_reason") is None
