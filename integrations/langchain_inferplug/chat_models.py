"""ChatInferPlug: a LangChain chat model on any inferplug profile (native engine, CTranslate2, remote ...)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, Literal

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LangSmithParams
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool

from inferplug.frontend.calls import Result, ResultBuilder, aiter_events, collect
from inferplug.frontend.requests import Prepared, build_request
from inferplug.frontend.tool_calls import parse_tool_calls
from langchain_inferplug.base import InferPlugFields
from langchain_inferplug.messages import to_chat_dicts
from langchain_inferplug.structured import structured_output_runnable, validate_json


class ChatInferPlug(InferPlugFields, BaseChatModel):
    """`ChatInferPlug(profile="smollm2-135m")`: every instance naming a profile shares one loaded engine."""

    max_retries: int = 2
    """Retries for JSON output on a backend without constrained decoding (it validates, then asks again)."""

    @property
    def _llm_type(self) -> str:
        return "inferplug"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"profile": self.profile.name, "model": self.model, "temperature": self.temperature,
                "max_tokens": self.max_tokens}

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_provider"] = "inferplug"
        params["ls_model_name"] = kwargs.get("model") or self.model
        return params

    # --- requests ------------------------------------------------------------------
    def _prepare(self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]) -> Prepared:
        return build_request(
            self.backend, options=self._options(stop, kwargs), messages=to_chat_dicts(messages),
            tools=kwargs.get("tools"), tool_choice=kwargs.get("tool_choice"),
            documents=kwargs.get("documents"), memory=self.document_memory,
        )

    def _message(self, result: Result, prepared: Prepared) -> AIMessage:
        calls = parse_tool_calls(result.text, prepared.tools) if prepared.tools else []
        u = result.usage
        return AIMessage(
            content="" if calls else result.text,
            tool_calls=[{"name": c.name, "args": c.arguments, "id": c.id, "type": "tool_call"} for c in calls],
            usage_metadata={"input_tokens": u.prompt_tokens, "output_tokens": u.completion_tokens,
                            "total_tokens": u.total_tokens, "input_token_details": {"cache_read": u.cached_tokens}},
            response_metadata=self._response_metadata(result, bool(calls)),
        )

    def _response_metadata(self, result: Result, called: bool) -> dict[str, Any]:
        meta: dict[str, Any] = {"model_name": self.model, "finish_reason": "tool_calls" if called
                                else result.finish_reason, "model_provider": "inferplug"}
        if result.timings is not None:
            meta["ttft_s"] = result.timings.ttft
        return meta

    def _needs_validation(self, prepared: Prepared) -> bool:
        """JSON output the backend cannot constrain: validate it and ask again."""
        return prepared.request.params.json_schema is not None and not self.backend.capabilities.json_schema

    # --- sync ------------------------------------------------------------------------
    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        prepared = self._prepare(messages, stop, kwargs)
        for attempt in range(self.max_retries + 1):
            result = collect(self.backend.stream_sync(prepared.request))
            if not self._needs_validation(prepared) or validate_json(result.text, prepared, attempt, self.max_retries):
                break
            prepared = self._prepare(messages, stop, kwargs)  # a fresh request id
        return ChatResult(generations=[ChatGeneration(message=self._message(result, prepared))])

    def _stream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        prepared = self._prepare(messages, stop, kwargs)
        builder = ResultBuilder()
        for event in self.backend.stream_sync(prepared.request):
            builder.add(event)
            if event.text and not prepared.tools and event.index == 0:
                chunk = ChatGenerationChunk(message=AIMessageChunk(content=event.text))
                if run_manager:
                    run_manager.on_llm_new_token(event.text, chunk=chunk)
                yield chunk
        yield self._last_chunk(builder.build(), prepared)

    def _last_chunk(self, result: Result, prepared: Prepared) -> ChatGenerationChunk:
        """The closing chunk: usage (on this chunk only), metadata, and any tool calls as tool-call chunks."""
        message = self._message(result, prepared)
        return ChatGenerationChunk(message=AIMessageChunk(
            content=message.content if prepared.tools else "",
            tool_call_chunks=[{"name": c["name"], "args": json.dumps(c["args"]), "id": c["id"], "index": i,
                               "type": "tool_call_chunk"} for i, c in enumerate(message.tool_calls)],
            usage_metadata=message.usage_metadata,
            response_metadata=message.response_metadata,
            chunk_position="last",
        ))

    # --- async -----------------------------------------------------------------------
    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        prepared = self._prepare(messages, stop, kwargs)
        for attempt in range(self.max_retries + 1):
            builder = ResultBuilder()
            async for event in aiter_events(self.backend, prepared.request):
                builder.add(event)
            result = builder.build()
            if not self._needs_validation(prepared) or validate_json(result.text, prepared, attempt, self.max_retries):
                break
            prepared = self._prepare(messages, stop, kwargs)
        return ChatResult(generations=[ChatGeneration(message=self._message(result, prepared))])

    async def _astream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                       run_manager: AsyncCallbackManagerForLLMRun | None = None,
                       **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        prepared = self._prepare(messages, stop, kwargs)
        builder = ResultBuilder()
        async for event in aiter_events(self.backend, prepared.request):
            builder.add(event)
            if event.text and not prepared.tools and event.index == 0:
                chunk = ChatGenerationChunk(message=AIMessageChunk(content=event.text))
                if run_manager:
                    await run_manager.on_llm_new_token(event.text, chunk=chunk)
                yield chunk
        yield self._last_chunk(builder.build(), prepared)

    def batch(self, inputs: list[Any], config: Any = None, *, return_exceptions: bool = False,
              **kwargs: Any) -> list[BaseMessage]:
        """Every input in flight at once by default (the engine batches them), not a pool sized by the CPU count."""
        everyone = max(len(inputs), 1)
        if isinstance(config, list):
            config = [{**c, "max_concurrency": c.get("max_concurrency") or everyone} for c in config]
        else:
            config = {**(config or {}), "max_concurrency": (config or {}).get("max_concurrency") or everyone}
        return super().batch(inputs, config, return_exceptions=return_exceptions, **kwargs)

    # --- tools and structured output -------------------------------------------------------
    def bind_tools(self, tools: Sequence[dict[str, Any] | type | Callable | BaseTool], *,
                   tool_choice: dict | str | bool | None = None, **kwargs: Any) -> Runnable:
        """Tools are rendered through the model's chat template; a required choice is constrained decoding."""
        formatted = [convert_to_openai_tool(t) for t in tools]
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        return super().bind(tools=formatted, **kwargs)

    def with_structured_output(self, schema: Any = None, *, include_raw: bool = False,
                               method: Literal["json_schema", "function_calling", "json_mode"] = "json_schema",
                               **kwargs: Any) -> Runnable:
        """Constrained decoding to the schema's JSON (guaranteed valid with the native engine)."""
        return structured_output_runnable(self, schema, method=method, include_raw=include_raw, **kwargs)



