"""The one request builder: every front end (LangChain, LlamaIndex, the server, the CLI) turns its call into a
backend Request here, so sampling defaults, stop lists, tools, response formats and document hints follow one
set of rules, checked against what the backend can do.

What a backend cannot do is never silently ignored: document cache hints are dropped with a warning (the
request still works, uncached), tools and JSON output on a backend without constrained decoding are refused
with a RequestError that names the backend.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import Any

from inferplug.errors import RequestError
from inferplug.frontend.tool_calls import call_schema, select_tools, template_renders_tools, tool_history
from inferplug.rag.documents import as_rag_document
from inferplug.rag.layout import DocumentMemory
from inferplug.types import Request, SamplingParams


# Greedy decoding under a grammar can trap a small model in a loop inside a free-text string (SmolLM2-135M writes
# "sampu, sampu, ..." until max_tokens and the JSON never closes); a mild penalty lets it finish the value. Decided
# here, once, so a JSON schema answers alike from every front end; a call's or the profile's own value wins.
CONSTRAINED_REPETITION_PENALTY = 1.2


class UncachedDocumentsWarning(UserWarning):
    """Document cache hints were given to a backend without a document cache; the request runs uncached."""


def no_document_cache_why(backend: Any) -> str:
    """Why `backend` keeps no document KV, and the fix: the plan's own line on the native engine (off by default,
    or a family it does not take yet), else that another backend has none."""
    off = [r for r in getattr(getattr(backend, "plan", None), "reasons", []) if r.startswith("RAG document cache off")]
    if backend.name == "native" and off:
        return off[0]
    return f"the {backend.name} backend has no document cache; a profile on the native engine keeps one"


def sampling_params(profile_defaults: dict[str, Any], **options: Any) -> SamplingParams:
    """Profile defaults, overridden by every option that is not None. Stop lists are merged: the profile's
    stops (often a model's end-of-turn markers) stay, the call's are added."""
    values = {**profile_defaults, **{k: v for k, v in options.items() if v is not None and k != "stop"}}
    stop = options.get("stop")
    stops = [stop] if isinstance(stop, str) else [s for s in (stop or []) if s]
    values["stop"] = list(dict.fromkeys([*(profile_defaults.get("stop") or []), *stops]))
    unknown = set(values) - set(SamplingParams.__dataclass_fields__)
    if unknown:
        raise RequestError(f"unknown generation option(s) {sorted(unknown)}; known: "
                           f"{sorted(SamplingParams.__dataclass_fields__)}", param=sorted(unknown)[0])
    return SamplingParams(**values)  # which checks its fields


def response_schema(response_format: dict[str, Any] | None) -> dict[str, Any] | None:
    """The JSON schema an OpenAI `response_format` asks for (None: free text)."""
    fmt = response_format or {}
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


@dataclass
class Prepared:
    request: Request
    tools: list[dict[str, Any]]  # the tools the model may call (to parse its answer against)
    tool_required: bool
    parallel_tool_calls: bool = False  # False: the server keeps only the first call parsed from the answer
    backend: Any = None  # the backend it was built for, which runs it (found once a call)


def build_request(
    backend: Any,
    *,
    messages: list[dict[str, Any]] | None = None,
    prompt: str | list[int] | None = None,
    options: dict[str, Any] | None = None,
    params: SamplingParams | None = None,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: Any = None,
    parallel_tool_calls: bool = False,
    response_format: dict[str, Any] | None = None,
    documents: list[Any] | None = None,
    memory: DocumentMemory | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> Prepared:
    """A Request for `backend`: sampling `options` (None values: the profile's default; `stop` is merged)
    over the profile's [sampling], tool constraints, the response format's schema, and document cache hints
    for the `documents` given or those `memory` finds in the prompt. `parallel_tool_calls` is OpenAI's: the
    server passes the client's (default true); the integrations constrain to one call, as before. `params`: a
    SamplingParams taken whole instead (the offline LLM's, as vLLM's), with no options or response format.
    `chat_template_kwargs`: the chat template's extra variables (Qwen3's enable_thinking), as vLLM takes them."""
    schema = response_schema(response_format) if response_format is not None else None
    if params is None:
        options = dict(options or {})
        if schema is not None:
            if options.get("json_schema") is not None:
                raise RequestError("give the JSON schema once: response_format or json_schema",
                                   param="response_format")
            options["json_schema"] = schema
        defaults = backend.profile.sampling.model_dump(exclude_none=True)  # the values the profile's [sampling] sets
        if options.get("json_schema") is not None and "repetition_penalty" not in defaults:
            defaults["repetition_penalty"] = CONSTRAINED_REPETITION_PENALTY
        params = sampling_params(defaults, **options)
    offered, required = select_tools(tools or [], tool_choice) if tools or tool_choice is not None else ([], False)
    # a named function is one call (as in vLLM); "required" with parallel calls is a non-empty array of them
    parallel = parallel_tool_calls and tool_choice in (None, "auto", "any", "required", True)
    if required:
        if params.json_schema is not None:
            raise RequestError("a required tool call and a JSON response format cannot be combined; "
                               "use one of them", param="tool_choice")
        params = replace(params, json_schema=call_schema(offered, parallel))  # checked again
    _check_capabilities(backend, params, offered)
    if messages is not None and getattr(backend, "tokenizer", None) is not None:  # a remote server reads OpenAI's
        calls = bool(offered or any(m.get("tool_calls") for m in messages))
        if calls or any(m.get("content") is None for m in messages):  # else the messages are the template's as sent
            # whether the template renders tools matters only where there are tools or calls
            messages = tool_history(messages, offered, calls and template_renders_tools(backend))
    hints = _document_hints(backend, documents, memory) if documents or memory is not None and memory.docs else None
    request = Request(prompt=prompt, messages=messages, params=params, tools=offered or None, documents=hints,
                      tool_choice=_openai_tool_choice(offered, required, tool_choice) if offered else None,
                      parallel_tool_calls=parallel if offered else None,
                      response_format=response_format if schema is not None else None,
                      chat_template_kwargs=chat_template_kwargs or None)
    return Prepared(request, offered, required, parallel, backend)


def _openai_tool_choice(offered: list[dict[str, Any]], required: bool, tool_choice: Any) -> str | dict[str, Any]:
    """The call's tool_choice in OpenAI's words (LangChain also says "any" or True, or names a tool bare)."""
    if not required:
        return "auto"
    if tool_choice in ("any", "required", True):
        return "required"
    return {"type": "function", "function": {"name": offered[0]["function"]["name"]}}


def _check_capabilities(backend: Any, params: SamplingParams, offered: list[dict[str, Any]]) -> None:
    caps = backend.capabilities
    if offered and not caps.tools:
        raise RequestError(f"the {backend.name} backend cannot call tools (no constrained decoding); drop "
                           "`tools` or use a profile on the native engine", param="tools")
    if params.json_schema is not None and not caps.json_schema:
        raise RequestError(f"the {backend.name} backend cannot constrain output to a JSON schema; drop the "
                           "response format or use a profile on the native engine (with xgrammar installed)",
                           param="response_format")
    if params.use_beam_search and not caps.beam_search:
        raise RequestError(f"the {backend.name} backend does not run beam search; drop use_beam_search or use a "
                           "profile on the native engine", param="use_beam_search")
    if params.prompt_logprobs is not None and not caps.prompt_logprobs:
        raise RequestError(f"the {backend.name} backend does not score prompt tokens; drop prompt_logprobs (or echo "
                           "with logprobs) or use a profile on the native engine", param="prompt_logprobs")


def _document_hints(backend: Any, documents: list[Any] | None, memory: DocumentMemory | None) -> list[Any] | None:
    """The documents given, or those remembered in `memory`, as RagDocuments: the prompt stage finds them in the
    prompt it renders (stages/prompt.document_hints), so the chat is rendered once. None: a backend without a
    document cache (then the request runs uncached, and a warning says so)."""
    if not backend.capabilities.rag_cache:
        if documents:  # remembered documents were never asked for by this call: nothing to warn about
            warnings.warn(f"the documents are used as plain prompt text, uncached: {no_document_cache_why(backend)}",
                          UncachedDocumentsWarning, stacklevel=3)
        return None
    return [as_rag_document(d) for d in documents] if documents else list(memory.docs.values())
