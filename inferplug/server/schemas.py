"""Request bodies of the OpenAI-compatible API, and their sampling options.

Field names and meanings follow OpenAI's API; the extra sampling fields (top_k, min_p,
repetition_penalty, ignore_eos, ...) follow vLLM's server. Unknown fields are ignored, as
OpenAI clients send some we have no use for (user, service_tier, ...), except those that would
change the output were they honoured (UNSUPPORTED): those get a 400 naming what to use instead.
The fields become a backend Request in inferplug.frontend.requests, as every front end's calls do.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from inferplug.errors import RequestError


_GUIDED = ("this server constrains output by JSON schema only: send response_format={\"type\": \"json_schema\", "
           "\"json_schema\": {\"name\": ..., \"schema\": ...}}, or tools")
_LEGACY = "send tools and tool_choice, which replace OpenAI's legacy function-calling fields"
# fields OpenAI's or vLLM's server would honour and this one does not, with what to send instead
UNSUPPORTED = {
    "guided_json": _GUIDED, "guided_choice": _GUIDED, "guided_regex": _GUIDED, "guided_grammar": _GUIDED,
    "structured_outputs": _GUIDED, "functions": _LEGACY, "function_call": _LEGACY,
    "allowed_token_ids": "raise the tokens you want with logit_bias, or constrain the output with response_format",
    "bad_words": "give their tokens a logit_bias of -100",
}


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None  # optional, as in vLLM: the served model
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
    logit_bias: dict[str, float] | None = None  # token id (a JSON key: a string) -> bias
    include_stop_str_in_output: bool | None = None
    use_beam_search: bool | None = None  # vLLM's; the beams, length_penalty and early_stopping as in transformers
    beam_width: int | None = None
    length_penalty: float | None = None
    early_stopping: bool | Literal["never"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, body: Any) -> Any:
        for name, fix in UNSUPPORTED.items():
            if isinstance(body, dict) and body.get(name):  # an empty value asks for nothing
                raise RequestError(f"{name} is not supported: {fix}", param=name)
        return body

    def sampling_options(self, logprobs: int | None, max_tokens: int | None) -> dict[str, Any]:
        """The request's sampling fields for the request builder (None: the profile's default)."""
        fields = ("n", "temperature", "top_p", "seed", "presence_penalty", "frequency_penalty", "top_k", "min_p",
                  "repetition_penalty", "min_tokens", "ignore_eos", "stop_token_ids", "include_stop_str_in_output",
                  "use_beam_search", "beam_width", "length_penalty", "early_stopping")
        return {**{k: getattr(self, k) for k in fields}, "stop": self.stop, "max_tokens": max_tokens,
                "logprobs": logprobs, "logit_bias": _token_biases(self.logit_bias)}

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Common):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False  # the prompt before the completion; with logprobs, its tokens' logprobs too (the first: null)
    prompt_logprobs: int | None = Field(default=None, ge=0, le=20)  # vLLM's: the choice's prompt_logprobs list
    suffix: str | None = None
    best_of: int | None = None

    @model_validator(mode="after")
    def _supported(self) -> CompletionRequest:
        if self.max_tokens == 0 and not self.echo:
            raise ValueError("max_tokens=0 generates nothing: use it with echo=true to score the prompt (as "
                             "lm-evaluation-harness does), or give max_tokens >= 1")
        if self.suffix:
            raise ValueError("suffix (insertion) is not supported; send the whole prompt instead")
        if self.use_beam_search and self.best_of is not None:  # vLLM's beam search reads best_of as the width
            self.beam_width = self.beam_width or self.best_of
        elif self.best_of not in (None, self.n):
            raise ValueError("best_of is not supported without use_beam_search; use n to get several completions")
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("prompt is an empty list; give a string, a list of strings or token ids")
        return self

    def prompts(self) -> list[str | list[int]]:
        """The batch of prompts: one string, several strings, token ids, or several lists of ids."""
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]  # type: ignore[list-item]
        return list(p)  # type: ignore[arg-type]

    @property
    def prompt_only(self) -> bool:
        """max_tokens=0 with echo: the prompt scored, nothing generated (one token is, then dropped)."""
        return self.max_tokens == 0

    def to_options(self) -> dict[str, Any]:
        scored = self.prompt_logprobs if self.prompt_logprobs is not None else self.logprobs if self.echo else None
        return {**self.sampling_options(self.logprobs, 1 if self.prompt_only else self.max_tokens),
                "prompt_logprobs": scored}


class FunctionDefinition(BaseModel):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # constrained decoding is always strict


class Tool(BaseModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"] = "function"
    function: NamedFunction


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
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's extension: {"enable_thinking": false} for Qwen3
    reasoning_effort: Literal["low", "medium", "high"] | None = None  # OpenAI's; gpt-oss's template reads it

    def to_options(self) -> dict[str, Any]:
        if self.top_logprobs is not None and not self.logprobs:
            raise RequestError("top_logprobs needs logprobs=true", param="top_logprobs")
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        return self.sampling_options(logprobs, max_tokens)


def _token_biases(raw: dict[str, float] | None) -> dict[int, float] | None:
    """logit_bias's JSON keys (token ids written in ASCII digits, as OpenAI takes them) as ints."""
    if raw is None:
        return None
    bad = next((key for key in raw if not re.fullmatch(r"[0-9]{1,9}", key)), None)
    if bad is not None:
        raise RequestError(f"logit_bias has the key {bad!r}: keys are token ids, such as \"7042\"",
                           param="logit_bias")
    return {int(key): bias for key, bias in raw.items()}
