"""Building backend Requests from a front end's call: sampling options, tools, RAG cache hints."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inferplug.errors import RequestError
from inferplug.frontend.tool_calls import call_schema, select_tools, template_renders_tools, with_tool_instructions
from inferplug.rag.layout import DocumentMemory, document_spans
from inferplug.types import Request, SamplingParams


def sampling_params(profile_defaults: dict[str, Any], **options: Any) -> SamplingParams:
    """Profile defaults, overridden by every option that is not None; stop lists are merged."""
    values = {**profile_defaults, **{k: v for k, v in options.items() if v is not None and k != "stop"}}
    stops = [s for s in (options.get("stop") or []) if s]
    values["stop"] = list(dict.fromkeys([*(profile_defaults.get("stop") or []), *stops]))
    unknown = set(values) - set(SamplingParams.__dataclass_fields__)
    if unknown:
        raise RequestError(f"unknown generation option(s) {sorted(unknown)}; known: "
                           f"{sorted(SamplingParams.__dataclass_fields__)}", param=sorted(unknown)[0])
    params = SamplingParams(**values)
    params.validate()
    return params


@dataclass
class Prepared:
    request: Request
    tools: list[dict[str, Any]]  # the tools the model may call (to parse its answer against)
    tool_required: bool


def prepare_request(
    backend: Any,
    params: SamplingParams,
    *,
    messages: list[dict[str, Any]] | None = None,
    prompt: str | None = None,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: Any = None,
    documents: list[Any] | None = None,
    memory: DocumentMemory | None = None,
) -> Prepared:
    """A Request with tool constraints and document cache hints (for documents given or remembered)."""
    offered, required = select_tools(tools or [], tool_choice)
    if required:
        if params.json_schema is not None:
            raise RequestError("a required tool call and a JSON response schema cannot be combined; "
                               "use one of them", param="tool_choice")
        params.json_schema = call_schema(offered)
    if offered and messages is not None and not template_renders_tools(backend):
        messages = with_tool_instructions(messages, offered)
    text = None
    if documents or (memory is not None and len(memory)):
        text = prompt if prompt is not None else backend.apply_chat_template(messages, offered or None)
    spans = None
    if text is not None:
        spans = document_spans(text, documents) if documents else memory.spans_in(text)
    request = Request(prompt=prompt, messages=messages, params=params, tools=offered or None,
                      documents=spans or None)
    return Prepared(request, offered, required)
