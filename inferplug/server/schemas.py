"""Request bodies of the OpenAI-compatible API, and their mapping to our SamplingParams.

Field names and meanings follow OpenAI's API; the extra sampling fields (top_k, min_p,
repetition_penalty, ignore_eos, ...) follow vLLM's server. Unknown fields are ignored, as
OpenAI clients send some we have no use for (user, service_tier, ...).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from inferplug.errors import RequestError
from inferplug.types import SamplingParams


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    n: int = Field(default=1, ge=1, le=128)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    # vLLM's extra sampling fields
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool | None = None

    def sampling_params(self, defaults: dict[str, Any], logprobs: int | None,
                        max_tokens: int | None) -> SamplingParams:
        """The request's values over the profile's defaults, validated."""
        values = dict(defaults)
        fields = ("n", "temperature", "top_p", "seed", "presence_penalty", "frequency_penalty", "top_k", "min_p",
                  "repetition_penalty", "min_tokens", "ignore_eos", "stop_token_ids", "include_stop_str_in_output")
        values.update({k: getattr(self, k) for k in fields if getattr(self, k) is not None})
        if self.stop is not None:
            values["stop"] = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        if max_tokens is not None:
            if max_tokens < 1:
                raise RequestError(f"max_tokens={max_tokens} is invalid: use a positive integer", param="max_tokens")
            values["max_tokens"] = max_tokens
        values["logprobs"] = logprobs
        params = SamplingParams(**values)
        params.validate()
        return params

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Common):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    @model_validator(mode="after")
    def _supported(self) -> CompletionRequest:
        if self.echo:
            raise ValueError("echo=true is not supported; prepend the prompt to the completion yourself")
        if self.suffix:
            raise ValueError("suffix (insertion) is not supported; send the whole prompt instead")
        if self.best_of not in (None, self.n):
            raise ValueError("best_of is not supported; use n to get several completions")
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("prompt is an empty list; give a string, a list of strings or token ids")
        return self

    def prompts(self) -> list[str | list[int]]:
        """The batch of prompts: one string, several strings, token ids, or several lists of ids."""
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]  # type: ignore[list-item]
        return list(p)  # type: ignore[arg-type]

    def to_params(self, defaults: dict[str, Any]) -> SamplingParams:
        return self.sampling_params(defaults, self.logprobs, self.max_tokens)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # tool_calls, tool_call_id, name... go to the template as given

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None

    def as_dict(self) -> dict[str, Any]:
        message = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):  # content parts: only text is understood by a text model
            kinds = {part.get("type") for part in self.content} - {"text"}
            if kinds:
                raise RequestError(f"message content parts of type {sorted(kinds)} are not supported; "
                                   "send text parts only", param="messages")
            message["content"] = "".join(part.get("text", "") for part in self.content)
        if self.role == "developer":  # OpenAI's newer name for the system role
            message["role"] = "system"
        return message


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    max_completion_tokens: int | None = None
    tools: list[dict[str, Any]] | None = None
    response_format: dict[str, Any] | None = None

    def to_params(self, defaults: dict[str, Any]) -> SamplingParams:
        if self.top_logprobs is not None and not self.logprobs:
            raise RequestError("top_logprobs needs logprobs=true", param="top_logprobs")
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        params = self.sampling_params(defaults, logprobs, max_tokens)
        params.json_schema = self._json_schema()
        return params

    def _json_schema(self) -> dict[str, Any] | None:
        fmt = self.response_format or {}
        kind = fmt.get("type", "text")
        if kind == "text":
            return None
        if kind == "json_object":
            return {"type": "object"}
        if kind == "json_schema" and isinstance(fmt.get("json_schema"), dict) and "schema" in fmt["json_schema"]:
            return fmt["json_schema"]["schema"]
        raise RequestError("response_format must be {'type': 'text' | 'json_object'} or "
                           "{'type': 'json_schema', 'json_schema': {'name': ..., 'schema': {...}}}",
                           param="response_format")
