"""Document KV computed at indexing time, as TurboRAG does: each chunk's KV is paid for once, before any query.

A precompute request is one document in the layout queries use (rag_messages through the chat template when there
is one, else rag_prompt), with its span as the cache hint, under the salt the corpus is served under, generating one
greedy token. The engine's document cache stores the document's KV as for any request (and on disk, with a disk
tier), so later queries, in this process or a restarted one, find it next to other neighbours.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from inferplug.errors import InferPlugError
from inferplug.rag.documents import as_rag_document
from inferplug.rag.layout import document_spans, rag_messages, rag_prompt
from inferplug.types import Request, SamplingParams


def precompute_request(doc: Any, salt: str | None,
                       render_chat: Callable[[list[dict[str, Any]], Any], str] | None) -> Request:
    """doc: a str, RagDocument, LangChain Document or LlamaIndex node. render_chat(messages, tools): the chat
    template the queries go through (None: a completion model, plain prompts)."""
    doc = as_rag_document(doc)
    params = SamplingParams(temperature=0.0, max_tokens=1)
    messages = rag_messages("", [doc])
    try:
        text = render_chat(messages, None) if render_chat is not None else None
    except InferPlugError:  # the model has no chat template: its queries are plain prompts
        text = None
    if text is not None:
        request = Request(messages=messages, params=params, cache_salt=salt)
    else:
        text = rag_prompt("", [doc])
        request = Request(prompt=text, params=params, cache_salt=salt)
    request.documents = document_spans(text, [doc]) or None
    return request
