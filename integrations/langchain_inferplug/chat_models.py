"""ChatInferPlug: a LangChain chat model on any inferplug profile (native engine, CTranslate2, remote ...)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, Literal

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.language_models.chat_models import agenerate_from_stream, generate_from_stream
from langchain_core.language_models.model_profile import ModelProfile
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages.tool import invalid_tool_call, tool_call
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool

from inferplug.chat_template import template_variables
from inferplug.errors import RequestError
from inferplug.frontend.calls import Result, ResultBuilder, acollect, generate_all
from inferplug.frontend.openai_logprobs import chat_logprobs
from inferplug.frontend.requests import Prepared, build_request
from inferplug.frontend.tool_calls import all_whole, finish_with_calls
from langchain_inferplug.base import InferPlugFields
from langchain_inferplug.messages import chat_dict
from langchain_inferplug.model_profile import model_profile
from langchain_inferplug.structured import structured_output_runnable
from langchain_inferplug.tool_stream import ToolCallStream, call_chunk


class ChatInferPlug(InferPlugFields, BaseChatModel):
    """`ChatInferPlug(profile="smollm2-135m")`: every instance naming a profile shares one loaded engine."""

    chat_template_kwargs: dict[str, Any] | None = None
    """The chat template's extra variables for every call (a call's own `chat_template_kwargs=` replaces them), as
    vLLM's: `{"enable_thinking": False}` turns Qwen3's thinking off."""
    reasoning_effort: Literal["low", "medium", "high"] | None = None
    """ChatOpenAI's parameter: gpt-oss's template reads it (its "Reasoning:" line); `chat_template_kwargs` win."""
    max_retries: int = 2
    """LangChain's standard parameter. Nothing here is retried per call: JSON output is constrained (a backend
    that cannot constrain is refused up front), and a remote profile retries as its [openai] max_retries says."""

    def _resolve_model_profile(self) -> ModelProfile | None:
        return model_profile(self.inferplug_profile, self.context_length)

    # --- requests ------------------------------------------------------------------
    def _prepare(self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]) -> Prepared:
        backend = self.backend  # found once a call: the request carries it (Prepared.backend)
        if kwargs.get("response_format") is not None and not backend.capabilities.json_schema:
            raise RequestError(f"response_format needs constrained decoding, which the {backend.name} backend "
                               "does not do; use a ToolStrategy (create_agent) or with_structured_output, or a "
                               "native or openai profile", param="response_format")
        variables = kwargs.get("chat_template_kwargs", self.chat_template_kwargs)
        if effort := kwargs.get("reasoning_effort", self.reasoning_effort):
            variables = template_variables(variables, effort)
        return build_request(
            backend, options=self._options(stop, kwargs), messages=[chat_dict(m) for m in messages],
            tools=kwargs.get("tools"), tool_choice=kwargs.get("tool_choice"),
            response_format=kwargs.get("response_format"), documents=kwargs.get("documents"),
            memory=self.document_memory, chat_template_kwargs=variables,
        )

    def _message(self, result: Result, prepared: Prepared) -> AIMessage:
        calls = result.calls(prepared.tools, prepared.tool_required) if prepared.tools else []
        # a call cut short (max_tokens) is an invalid tool call with its partial arguments, as ChatOpenAI gives it
        return AIMessage(
            content=result.content(calls) if calls else result.text,  # no call on the plain path (test_call_count)
            additional_kwargs={"reasoning_content": result.reasoning} if result.reasoning else {},
            tool_calls=[tool_call(name=c.name, args=c.arguments, id=c.id) for c in calls if c.partial is None],
            invalid_tool_calls=[invalid_tool_call(name=c.name, args=c.partial, id=c.id, error=_CUT)
                                for c in calls if c.partial is not None],
            usage_metadata=_usage(result),
            response_metadata=self._response_metadata(result, all_whole(calls) if calls else False),
        )

    def _response_metadata(self, result: Result, called: bool) -> dict[str, Any]:
        finish = finish_with_calls(result.finish_reason, called) if called else result.finish_reason
        meta: dict[str, Any] = {"model_name": self.model, "finish_reason": finish, "model_provider": "inferplug"}
        if result.timings is not None:
            meta["ttft_s"] = result.timings.ttft
        if result.logprobs is not None:
            meta["logprobs"] = chat_logprobs(result.logprobs)
        return meta

    # --- sync ------------------------------------------------------------------------
    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        prepared = self._prepare(messages, stop, kwargs)
        if run_manager is not None and run_manager.handlers:
            return generate_from_stream(self._stream_prepared(prepared, run_manager))  # tokens to the handlers
        result, = generate_all(prepared.backend, [prepared.request], timeout=self.timeout)  # finished, no stream
        return ChatResult(generations=[ChatGeneration(message=self._message(result, prepared))])

    def _stream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        yield from self._stream_prepared(self._prepare(messages, stop, kwargs), run_manager)

    def _stream_prepared(self, prepared: Prepared,
                         run_manager: CallbackManagerForLLMRun | None) -> Iterator[ChatGenerationChunk]:
        stream = _ChunkStream(self, prepared)
        for event in prepared.backend.stream_sync(prepared.request, timeout=self.timeout):
            for chunk in stream.step(event):
                if run_manager:
                    run_manager.on_llm_new_token(chunk.text, chunk=chunk)
                yield chunk

    # --- async -----------------------------------------------------------------------
    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        prepared = self._prepare(messages, stop, kwargs)
        if run_manager is not None and run_manager.handlers:
            return await agenerate_from_stream(self._astream_prepared(prepared, run_manager))
        result = await acollect(prepared.backend, prepared.request, timeout=self.timeout)
        return ChatResult(generations=[ChatGeneration(message=self._message(result, prepared))])

    async def _astream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                       run_manager: AsyncCallbackManagerForLLMRun | None = None,
                       **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        async for chunk in self._astream_prepared(self._prepare(messages, stop, kwargs), run_manager):
            yield chunk

    async def _astream_prepared(self, prepared: Prepared, run_manager: AsyncCallbackManagerForLLMRun | None
                                ) -> AsyncIterator[ChatGenerationChunk]:
        stream = _ChunkStream(self, prepared)
        async for event in prepared.backend.stream_async(prepared.request, timeout=self.timeout):
            for chunk in stream.step(event):
                if run_manager:
                    await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
                yield chunk

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


_CUT = "the generation ended (max_tokens or a stop string) before the call's arguments were complete JSON"


def _usage(result: Result) -> dict[str, Any]:
    u = result.usage
    return {"input_tokens": u.prompt_tokens, "output_tokens": u.completion_tokens, "total_tokens": u.total_tokens,
            "input_token_details": {"cache_read": u.cached_tokens}}


class _ChunkStream:
    """One call's events -> message chunks: text (or tool-call chunks while tools are bound) and reasoning as
    they come; usage, metadata and logprobs on the closing chunk."""

    def __init__(self, model: ChatInferPlug, prepared: Prepared) -> None:
        self.model, self.prepared, self.builder = model, prepared, ResultBuilder()
        self.tools = ToolCallStream(prepared.tools, prepared.tool_required) if prepared.tools else None

    def step(self, event: Any) -> list[ChatGenerationChunk]:
        self.builder.add(event)
        chunks = []
        if event.index == 0 and (event.text or event.reasoning or event.tool_calls):
            content, calls = self.tools.feed(event.text) if self.tools else (event.text, [])
            calls += [call_chunk(d) for d in event.tool_calls]  # a remote's own, its ids kept
            if content or calls or event.reasoning:
                chunks.append(self._chunk(content, calls, event.reasoning))
        if event.usage is not None:  # the request's last event
            chunks.append(self._last())
        return chunks

    def _chunk(self, content: str, calls: list[dict[str, Any]], reasoning: str, **extra: Any) -> ChatGenerationChunk:
        kwargs = {"reasoning_content": reasoning} if reasoning else {}
        return ChatGenerationChunk(message=AIMessageChunk(content=content, tool_call_chunks=calls,
                                                          additional_kwargs=kwargs, **extra))

    def _last(self) -> ChatGenerationChunk:
        result = self.builder.build()
        # a remote backend's calls came whole, as it parsed them
        content, calls = self.tools.finish() if self.tools and not result.tool_calls else ("", [])
        called = all_whole(result.tool_calls) or (self.tools is not None and self.tools.called)
        meta = self.model._response_metadata(result, called)
        return self._chunk(content, calls, "", usage_metadata=_usage(result), response_metadata=meta,
                           chunk_position="last")
