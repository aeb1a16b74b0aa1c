"""The prompt stage: a request's prompt as token ids, checked against the vocabulary and the context, and the
token limit the room left allows. The native engine and the local third-party backends check alike."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

from inferplug.chat_template import NO_TEMPLATE_FIX, encode_chat
from inferplug.errors import RequestError
from inferplug.rag.layout import document_spans
from inferplug.stages.prompt_bound import LONGER_CONTEXT, check_text_fits
from inferplug.types import DocumentSpan, Request, SamplingParams

if TYPE_CHECKING:
    from inferplug.backends.base import Backend


def check_prompt(prompt_ids: list[int], params: SamplingParams, vocab_size: int, context_length: int,
                 param: str = "prompt") -> None:
    """The checks every local backend makes once a prompt is tokenized, those that need the vocabulary or the context
    (SamplingParams checked its own fields where it was made): the prompt not empty, in the vocabulary, with room to
    generate; the stop token ids in the vocabulary."""
    if not prompt_ids:
        raise RequestError("the prompt is empty: give at least one token or character", param=param)
    bad = [t for t in prompt_ids if not isinstance(t, int) or not 0 <= t < vocab_size]
    if bad:
        raise RequestError(f"the prompt holds token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}",
                           param=param)
    if len(prompt_ids) >= context_length:
        raise RequestError(
            f"the prompt has {len(prompt_ids)} tokens but the context holds {context_length} "
            f"(including at least one generated token): {LONGER_CONTEXT}",
            param=param,
        )
    for name, ids in (("stop_token_ids", params.stop_token_ids), ("logit_bias", params.logit_bias)):
        unknown = [t for t in ids if t >= vocab_size]
        if unknown:
            raise RequestError(f"{name} names unknown token id {unknown[0]!r}: use ids >= 0 below the vocabulary "
                               f"size {vocab_size}", param=name)


class EncodedPrompt(NamedTuple):
    """A request's prompt as the prompt stage leaves it: its token ids, its text when it had one, and where its RAG
    documents lie in that text (document_hints; None: no hints)."""

    ids: list[int]
    text: str | None
    documents: list[DocumentSpan] | None = None


def encode_prompt(tokenizer: Any, render: Callable[..., str] | None, request: Request,
                  context_length: int) -> EncodedPrompt:
    """The request's prompt as token ids, its text when it had one, and its documents' spans in that text (the native
    engine and the local backends alike); `render(messages, tools)` renders a chat (`template_kwargs=` as well
    when the request has chat_template_kwargs). A text that surely
    overflows `context_length` is refused before it is tokenized (stages/prompt_bound.py). Raises RequestError on
    bad input."""
    if request.messages is not None:
        if render is None:
            raise RequestError(f"the model has no chat template, so it cannot take messages: {NO_TEMPLATE_FIX}",
                               param="messages")
        if request.chat_template_kwargs:
            render = partial(render, template_kwargs=request.chat_template_kwargs)
        ids, text = encode_chat(tokenizer, render, request.messages, request.tools, context_length)
    elif isinstance(request.prompt, str):
        check_text_fits(tokenizer, request.prompt, context_length, "prompt")
        ids, text = tokenizer.encode(request.prompt), request.prompt
    else:
        return EncodedPrompt(list(request.prompt or []), None)
    return EncodedPrompt(ids, text, document_hints(request.documents, text) if request.documents else None)


def document_hints(documents: list[Any], text: str) -> list[DocumentSpan] | None:
    """Request.documents as spans of the prompt's text: a DocumentSpan as given (its caller placed it), a document
    (rag.RagDocument) where its text occurs (rag/layout.document_spans: one not found verbatim is no hint)."""
    spans = [d for d in documents if isinstance(d, DocumentSpan)]
    return spans + document_spans(text, [d for d in documents if not isinstance(d, DocumentSpan)]) or None


def prompt_token_ids(backend: Backend, request: Request) -> list[int]:
    """The request's prompt as token ids, checked with its params against the vocabulary and the context."""
    ids = encode_prompt(backend.tokenizer, backend.apply_chat_template, request, backend.context_length).ids
    check_prompt(ids, request.params, len(backend.tokenizer), backend.context_length,
                 param="messages" if request.messages is not None else "prompt")
    return ids


def max_new_tokens(params: SamplingParams, prompt_len: int, context_length: int) -> int:
    """max_tokens, capped at the room left in the context (None means all of it)."""
    room = context_length - prompt_len
    return room if params.max_tokens is None else min(params.max_tokens, room)
