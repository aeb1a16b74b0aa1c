"""The prompt stage: a request's prompt as token ids, checked against the vocabulary and the context, and the
token limit the room left allows. The native engine and the local third-party backends check alike."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from inferplug.chat_template import encode_chat
from inferplug.errors import RequestError
from inferplug.stages.prompt_bound import check_text_fits
from inferplug.types import Request, SamplingParams

if TYPE_CHECKING:
    from inferplug.backends.base import Backend


def check_prompt_ids(prompt_ids: list[int], vocab_size: int, context_length: int, param: str = "prompt") -> None:
    """The checks every local backend makes on a tokenized prompt: not empty, in the vocabulary, room to generate."""
    if not prompt_ids:
        raise RequestError("the prompt is empty: give at least one token or character", param=param)
    bad = [t for t in prompt_ids if not isinstance(t, int) or not 0 <= t < vocab_size]
    if bad:
        raise RequestError(f"the prompt holds token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}",
                           param=param)
    if len(prompt_ids) >= context_length:
        raise RequestError(
            f"the prompt has {len(prompt_ids)} tokens but the context holds {context_length} "
            "(including at least one generated token): shorten the prompt or raise max_model_len",
            param=param,
        )


def encode_prompt(tokenizer: Any, render: Callable[..., str] | None, request: Request,
                  context_length: int) -> tuple[list[int], str | None]:
    """The request's prompt as token ids, and its text when it had one (the native engine and the local backends
    alike); `render(messages, tools)` renders a chat. A text that surely overflows `context_length` is refused
    before it is tokenized (stages/prompt_bound.py). Raises RequestError on bad input."""
    if request.messages is not None:
        if render is None:
            raise RequestError("this engine has no chat template; send a prompt instead", param="messages")
        return encode_chat(tokenizer, render, request.messages, request.tools, context_length)
    if isinstance(request.prompt, str):
        check_text_fits(tokenizer, request.prompt, context_length, "prompt")
        return tokenizer.encode(request.prompt), request.prompt
    return list(request.prompt or []), None


def prompt_token_ids(backend: Backend, request: Request) -> list[int]:
    """The request's prompt as token ids, checked against the vocabulary and the context."""
    ids, _ = encode_prompt(backend.tokenizer, backend.apply_chat_template, request, backend.context_length)
    check_prompt_ids(ids, len(backend.tokenizer), backend.context_length,
                     param="messages" if request.messages is not None else "prompt")
    return ids


def max_new_tokens(params: SamplingParams, prompt_len: int, context_length: int) -> int:
    """max_tokens, capped at the room left in the context (None means all of it)."""
    room = context_length - prompt_len
    return room if params.max_tokens is None else min(params.max_tokens, room)
