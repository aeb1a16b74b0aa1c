"""Document KV computed at indexing time, as TurboRAG does: each chunk's KV is paid for once, before any query.

A precompute request is one document in the layout queries use (rag_messages through the chat template when there
is one, else rag_prompt), under the salt the corpus is served under, generating one greedy token. The prompt stage
finds the document's span in the text it renders (stages/prompt.document_hints; a caller runs only the requests
whose document the template keeps verbatim: LLM.precompute_documents, frontend/precompute.py); the engine's document cache
stores the document's KV as for any request (and on disk, with a disk tier), so later queries, in this process or a
restarted one, find it next to other neighbours.
"""

from __future__ import annotations

from typing import Any

from inferplug.rag.documents import as_rag_document
from inferplug.rag.layout import rag_messages, rag_prompt
from inferplug.types import Request, SamplingParams


def precompute_request(doc: Any, salt: str | None, chat: bool) -> Request:
    """doc: a str, RagDocument, LangChain Document or LlamaIndex node. chat: the queries go through the chat template
    (chat_template.chat_template_text finds one); False: a completion model's plain prompts."""
    doc = as_rag_document(doc)
    params = SamplingParams(temperature=0.0, max_tokens=1)
    if chat:
        return Request(messages=rag_messages("", [doc]), params=params, cache_salt=salt, documents=[doc])
    return Request(prompt=rag_prompt("", [doc]), params=params, cache_salt=salt, documents=[doc])
