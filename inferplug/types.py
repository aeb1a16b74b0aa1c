"""Backend-neutral request and event types. Every front end speaks only these."""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

from inferplug.errors import RequestError

FinishReason = Literal["stop", "length", "abort", "error", "tool_calls"]


@dataclass
class SamplingParams:
    """Sampling options, named as in vLLM and OpenAI. temperature 0 means greedy."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 256  # None: up to the end of the context
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    # OpenAI's and vLLM's: token id -> a value in [-100, 100] added to its logit before sampling (-100 bans it)
    logit_bias: dict[int, float] = field(default_factory=dict)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None  # None: off; k >= 0: the sampled token plus the top k
    # vLLM's: each prompt token's logprob given its prefix, plus the top k, on the choice's first event (the first
    # token has no prefix: None). Its prompt is computed, not taken from the prefix cache.
    prompt_logprobs: int | None = None
    json_schema: dict[str, Any] | None = None  # constrained decoding to this JSON schema
    # Beam search as transformers' generate(num_beams=beam_width, do_sample=False): it ranks by the model's
    # log-probs, so temperature, top_p, top_k, min_p and seed do not apply. The best beam is the one choice.
    use_beam_search: bool = False  # vLLM's field name
    beam_width: int = 4
    length_penalty: float = 1.0  # score = sum of log-probs / generated length ** length_penalty
    early_stopping: bool | Literal["never"] = False  # HF's: True, False (its heuristic) or "never"

    def __post_init__(self) -> None:
        """Each field's own checks, made where the params are made (dataclasses.replace makes them again): a
        RequestError naming the bad field and its valid range. The checks that need the vocabulary (stop_token_ids
        below its size) are the prompt stage's (stages/prompt.check_prompt)."""
        if isinstance(self.stop, str):
            self.stop = [self.stop]

        def bad(param: str, why: str) -> RequestError:
            return RequestError(f"{param}={getattr(self, param)!r} is invalid: {why}", param=param)

        if not isinstance(self.n, int) or self.n < 1:
            raise bad("n", "use an integer >= 1")
        for name, (low, high, low_excluded, fix) in _FLOAT_RANGES.items():
            value = getattr(self, name)
            if (not isinstance(value, (int, float)) or not math.isfinite(value) or not low <= value <= high
                    or low_excluded and value == low):
                raise bad(name, fix)
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise bad("top_k", "use -1 or 0 to disable, or a positive integer")
        # choice i samples with seed + i, and torch generators take a signed 64-bit seed
        if self.seed is not None and (not isinstance(self.seed, int) or not 0 <= self.seed <= 2**63 - self.n):
            raise bad("seed", f"use an integer in [0, 2**63 - n] = [0, {2**63 - self.n}]")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens <= 0):
            raise bad("max_tokens", "use a positive integer, or omit it to generate up to the context end")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise bad("min_tokens", "use an integer >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise bad("min_tokens", f"it must not exceed max_tokens={self.max_tokens}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or not 0 <= value <= 20):
                raise bad(name, "use an integer in [0, 20]")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise bad("stop", "use non-empty strings")
        if self.use_beam_search:
            self._validate_beam_search()
        for t in self.stop_token_ids:
            if not isinstance(t, int) or t < 0:
                raise RequestError(f"stop_token_ids contains unknown token id {t!r}: use ids >= 0",
                                   param="stop_token_ids")
        for t, bias in self.logit_bias.items():
            if not isinstance(t, int) or isinstance(t, bool) or t < 0:
                raise RequestError(f"logit_bias has the key {t!r}: keys are int token ids >= 0, such as "
                                   "{7042: -100} (the server's JSON takes them as strings)", param="logit_bias")
            if not _finite(bias) or not -100 <= bias <= 100:
                raise RequestError(f"logit_bias[{t}]={bias!r} is invalid: use a value in [-100, 100]",
                                   param="logit_bias")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def _validate_beam_search(self) -> None:
        def bad(param: str, why: str) -> RequestError:
            return RequestError(f"{param}={getattr(self, param)!r} is invalid with use_beam_search: {why}", param=param)

        if not isinstance(self.beam_width, int) or isinstance(self.beam_width, bool) or self.beam_width < 1:
            raise bad("beam_width", "use an integer >= 1")
        if not _finite(self.length_penalty):
            raise bad("length_penalty", "use a finite number (1.0: the mean log-prob, 0: the plain sum)")
        if not (isinstance(self.early_stopping, bool) or self.early_stopping == "never"):
            raise bad("early_stopping", 'use true, false or "never", as in transformers')
        if self.n != 1:
            raise bad("n", "beam search returns its best beam as the one choice; use n=1 (beam_width sets the beams)")
        if self.logprobs is not None:
            raise bad("logprobs", "a beam's tokens come with its score, not per-token logprobs; drop logprobs")
        if self.json_schema is not None:
            raise bad("json_schema", "constrained decoding does not run with beam search; drop one of them")


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


# SamplingParams' float fields: (lowest, highest, whether the lowest itself is refused, the fix). NaN and the
# infinities are refused.
_FLOAT_RANGES = {
    "temperature": (0.0, 2.0, False, "use a value in [0, 2] (0 is greedy)"),
    "top_p": (0.0, 1.0, True, "use a value in (0, 1]"),
    "min_p": (0.0, 1.0, False, "use a value in [0, 1]"),
    "repetition_penalty": (0.0, math.inf, True, "use a value > 0 (1 disables it)"),
    "presence_penalty": (-2.0, 2.0, False, "use a value in [-2, 2]"),
    "frequency_penalty": (-2.0, 2.0, False, "use a value in [-2, 2]"),
}


@dataclass(frozen=True)
class DocumentSpan:
    """A retrieved document inside a prompt: a RAG cache hint.

    `start`/`end` are character offsets into the rendered prompt text; `key` is
    the document's content hash (see inferplug.rag).
    """

    start: int
    end: int
    key: str


@dataclass
class Request:
    """One generation request: a text or token-id prompt, or chat messages."""

    prompt: str | list[int] | None = None
    messages: list[dict[str, Any]] | None = None
    params: SamplingParams = field(default_factory=SamplingParams)
    request_id: str = field(default_factory=partial(secrets.token_hex, 16))  # 32 random hex digits
    tools: list[dict[str, Any]] | None = None  # OpenAI tool schemas, rendered by the chat template
    # OpenAI's tool_choice ("auto", "required" or {"type": "function", "function": {"name": ...}}) and
    # parallel_tool_calls, for a backend that forwards them (a remote server); locally a required call is
    # already params.json_schema
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None  # OpenAI's, as asked; params.json_schema holds its schema
    # RAG cache hints: spans of the rendered prompt, or documents (rag.RagDocument) the prompt stage finds in it
    documents: list[Any] | None = None
    cache_salt: str | None = None  # isolates this request's prefix-cache entries
    # extra variables for the chat template, as vLLM's chat_template_kwargs (Qwen3's {"enable_thinking": False})
    chat_template_kwargs: dict[str, Any] | None = None
    client: str | None = None  # who asked (the server's tenant or remote address): admission is shared out by client

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise RequestError("give exactly one of prompt or messages", param="prompt")
        if self.prompt is not None and len(self.prompt) == 0:
            raise RequestError("the prompt is empty: give at least one token or character", param="prompt")
        if self.messages is not None and not self.messages:
            raise RequestError("messages is empty: give at least one message", param="messages")


@dataclass
class TokenLogprob:
    token_id: int
    token: str
    logprob: float | None  # None only for a prompt's first token, echoed (it has no prefix)
    top: list[tuple[int, str, float]] = field(default_factory=list)  # (id, text, logprob)


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix or RAG cache
    draft_tokens: int = 0  # speculative decoding (native engine): tokens proposed for this request
    accepted_draft_tokens: int = 0  # of those, the ones the model accepted (each one a forward pass saved)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class Timings:
    """Seconds, measured by the backend. tpot is None with fewer than two tokens."""

    queued: float = 0.0
    ttft: float | None = None
    tpot: float | None = None
    e2e: float = 0.0


@dataclass
class ToolCallDelta:
    """A piece of a tool call a backend parsed itself (a remote server), in OpenAI's streamed shape: the first
    piece of each call brings its id and name, the rest bring more of its JSON arguments."""

    index: int  # the call's place among the choice's calls
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass
class Event:
    """One step of a request's stream. The last event of each choice has finish_reason set,
    and the last event of the request carries usage and timings."""

    request_id: str
    index: int = 0  # the choice, for n > 1
    text: str = ""  # new text since the previous event of this choice
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    # SamplingParams.prompt_logprobs, on choice 0's first event: one entry per prompt token, None for the first
    prompt_logprobs: list[TokenLogprob | None] | None = None
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None  # the stop string or token id that matched
    usage: Usage | None = None
    timings: Timings | None = None
    error: str | None = None  # set with finish_reason="error"
    reasoning: str = ""  # new reasoning text (a reasoning model's <think> part), kept out of `text`
    tool_calls: list[ToolCallDelta] = field(default_factory=list)  # calls the backend parsed (not in `text`)
    beam_score: float | None = None  # beam search, on the choice's last event: its beam's score (HF's sequences_scores)


@dataclass
class Capabilities:
    """What a front end must know to shape a request for a backend; each field has a reader (frontend/requests.py,
    the server's n fan-out, LangChain's structured output). Every backend streams and gives logprobs alike."""

    n: bool = False  # n > 1 samples in one request; else the server fans out n requests
    tools: bool = False  # tool calls (constrained decoding); else the request builder refuses `tools`
    json_schema: bool = False  # constrained decoding to a JSON schema; else a RequestError or free-text parsing
    rag_cache: bool = False  # a document KV cache; else documents run as plain, uncached prompt text
    beam_search: bool = False  # SamplingParams.use_beam_search; else the request builder refuses it
    prompt_logprobs: bool = False  # SamplingParams.prompt_logprobs (the server's echo with logprobs); else refused
