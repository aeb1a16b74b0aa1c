"""InferPlug: a LlamaIndex FunctionCallingLLM on any inferplug profile."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, Literal

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    LogProb,
    MessageRole,
    TextBlock,
    ThinkingBlock,
)
from llama_index.core.prompts import PromptTemplate
from pydantic import BaseModel
from llama_index.core.bridge.pydantic import Field, PrivateAttr, SecretStr
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.llms.utils import parse_partial_json

from inferplug.chat_template import chat_template_text, template_variables
from inferplug.frontend.binding import bind_profile, usage_counts
from inferplug.frontend.calls import Result, ResultBuilder, acollect, generate_all
from inferplug.frontend.forced_call import ForcedCallStream
from inferplug.frontend.requests import Prepared, build_request
from inferplug.frontend.tool_calls import all_whole, finish_with_calls
from inferplug.rag.layout import DocumentMemory
from inferplug.types import SamplingParams, TokenLogprob
from llama_index.llms.inferplug.messages import to_chat_dicts
from llama_index.llms.inferplug.postprocessor import DocumentCacheHints
from llama_index.llms.inferplug.precompute import DocumentKVPrecompute
from llama_index.llms.inferplug.structured import apartial_objects, constrained_kwargs, partial_objects, validated


class InferPlug(FunctionCallingLLM):
    """`InferPlug(profile="smollm2-135m")`; every instance naming a profile shares one loaded engine."""

    profile: Any = Field(default=None, description="A profile name, TOML path, model (a .gguf file, an HF model dir, "
                                                   "hf:OWNER/REPO#file.gguf, pypi:REQ#member) or Profile (None: the "
                                                   "default).")
    context_length: int | None = Field(default=None, description="The context in tokens the engine holds (None: the "
                                                                 "profile's, else 4096), at most the model's maximum.")
    model: str | None = Field(default=None, description="The served model name (filled from the profile).")
    api_key: SecretStr | None = Field(default=None, description="As OpenAI's LLM takes it: a remote (backend = "
                                                                "'openai') profile sends it as its key, instead of "
                                                                "the env var its [openai] api_key_env names. A local "
                                                                "profile needs none: it accepts one and ignores it.")
    base_url: str | None = Field(default=None, description="The server a remote profile talks to, instead of its "
                                                           "[openai] base_url. A local profile needs none: it "
                                                           "accepts one and ignores it.")
    temperature: float | None = Field(default=None, description="None: the profile's default.")
    max_tokens: int | None = Field(default=None, description="None: the profile's default.")
    chat_template_kwargs: dict[str, Any] | None = Field(
        default=None, description="The chat template's extra variables (Qwen3: {'enable_thinking': False}); a call's "
                                  "own chat_template_kwargs replaces them.")
    reasoning_effort: Literal["low", "medium", "high"] | None = Field(
        default=None, description="OpenAI's reasoning effort, which gpt-oss's template reads; chat_template_kwargs "
                                  "win.")
    additional_kwargs: dict[str, Any] = Field(default_factory=dict,
                                              description="More sampling options (top_p, repetition_penalty, ...).")
    context_window: int | None = Field(default=None, description="None: the context the engine holds.")
    num_output: int | None = Field(default=None, description="Tokens LlamaIndex reserves for the answer "
                                                             "(None: max_tokens, else the profile's).")
    _memory: DocumentMemory = PrivateAttr(default_factory=DocumentMemory)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.profile, self.model = bind_profile(self.profile, self.model, self.context_length, api_key=self.api_key,
                                                base_url=self.base_url)

    @classmethod
    def class_name(cls) -> str:
        return "InferPlug"

    @property
    def backend(self) -> Any:
        from inferplug.backends.registry import get_backend

        return get_backend(self.profile)

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(
            context_window=self.context_window or self.backend.context_length,
            num_output=self.num_output or self.max_tokens or self.profile.sampling.max_tokens or 256,
            is_chat_model=self._chats,
            is_function_calling_model=True,
            model_name=self.model,
        )

    def document_hints(self) -> DocumentCacheHints:
        """A node postprocessor: canonical node order plus document cache hints for this LLM."""
        return DocumentCacheHints(memory=self._memory)

    def precompute_transform(self, salt: str | None = None) -> DocumentKVPrecompute:
        """An ingestion transform that computes and stores each node's KV at indexing time (TurboRAG)."""
        return DocumentKVPrecompute(llm=self, salt=salt)

    def evict_documents(self, nodes: list[Any] | None = None, salt: str | None = None) -> int:
        """Drop these nodes' stored KV under `salt` (None nodes: every document of the salt); the entries dropped."""
        return self.backend.evict_documents(nodes, salt)

    @property
    def _chats(self) -> bool:
        """Whether the model takes messages: it has a chat template (a base model's file carries none), or it is a
        remote server's, which renders its own."""
        tokenizer = self.backend.tokenizer
        return tokenizer is None or chat_template_text(self.profile, tokenizer) is not None

    # --- requests ------------------------------------------------------------------
    def _prepare(self, messages: Sequence[ChatMessage] | None, kwargs: dict[str, Any],
                 prompt: str | None = None) -> Prepared:
        """Sampling options: per-call kwargs > temperature/max_tokens fields > additional_kwargs > the profile.
        `prompt`: a plain prompt instead of messages (a completion on a model without a chat template)."""
        fields = {"temperature": self.temperature, "max_tokens": self.max_tokens}
        options = {**self.additional_kwargs, **{k: v for k, v in fields.items() if v is not None}}
        options.update({k: v for k, v in kwargs.items() if k in SamplingParams.__dataclass_fields__})
        options["stop"] = [*(self.additional_kwargs.get("stop") or []), *(kwargs.get("stop") or [])]
        return build_request(self.backend, options=options, prompt=prompt,
                             messages=None if messages is None else to_chat_dicts(list(messages)),
                             tools=kwargs.get("tools"), tool_choice=kwargs.get("tool_choice"),
                             documents=kwargs.get("documents"), memory=self._memory,
                             chat_template_kwargs=template_variables(
                                 kwargs.get("chat_template_kwargs", self.chat_template_kwargs),
                                 kwargs.get("reasoning_effort", self.reasoning_effort)))

    def _response(self, result: Result, prepared: Prepared, delta: str | None = None,
                  call_id: str | None = None) -> ChatResponse:
        """The whole answer; `call_id`: the id a stream already gave its required call."""
        calls = result.calls(prepared.tools, prepared.tool_required)
        if call_id is not None:
            calls = [dataclasses.replace(c, id=call_id) for c in calls]
        # beside calls parsed out of its text an answer has no content; a reply format's own calls leave a preamble
        extra = {"tool_calls": [_call_json(c.id, c.name, c.arguments_json()) for c in calls]} if calls else {}
        return ChatResponse(
            message=ChatMessage(role=MessageRole.ASSISTANT, blocks=_blocks(result.content(calls),
                                                                           result.reasoning),
                                additional_kwargs=extra),
            delta=delta,
            logprobs=_logprobs(result.logprobs),
            raw={"usage": usage_counts(result.usage),
                 "finish_reason": finish_with_calls(result.finish_reason, all_whole(calls)),
                 "ttft_s": result.timings.ttft if result.timings else None},
        )

    def _completion_request(self, prompt: str, kwargs: dict[str, Any]) -> Prepared:
        """One user turn through the chat template; a model without one (a base model) takes the prompt as is."""
        if not self._chats:
            return self._prepare(None, kwargs, prompt=prompt)
        system = [ChatMessage(role=MessageRole.SYSTEM, content=self.system_prompt)] if self.system_prompt else []
        return self._prepare([*system, ChatMessage(role=MessageRole.USER, content=prompt)], kwargs)

    def _answer(self, prepared: Prepared) -> ChatResponse:
        result, = generate_all(self.backend, [prepared.request])  # finished, no stream (as ChatInferPlug's)
        return self._response(result, prepared)

    def _stream(self, prepared: Prepared) -> ChatResponseGen:
        stream = _ChatStream(self, prepared)
        for event in self.backend.stream_sync(prepared.request):
            if (response := stream.step(event)) is not None:
                yield response

    async def _aanswer(self, prepared: Prepared) -> ChatResponse:
        return self._response(await acollect(self.backend, prepared.request), prepared)

    async def _astream(self, prepared: Prepared) -> ChatResponseAsyncGen:
        stream = _ChatStream(self, prepared)
        async for event in self.backend.stream_async(prepared.request):
            if (response := stream.step(event)) is not None:
                yield response

    # --- chat --------------------------------------------------------------------------
    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return self._answer(self._prepare(messages, kwargs))

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        return self._stream(self._prepare(messages, kwargs))  # prepared now: a bad request raises at the call

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return await self._aanswer(self._prepare(messages, kwargs))

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        return self._astream(self._prepare(messages, kwargs))

    # --- completion ----------------------------------------------------------------------------
    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return _completion(self._answer(self._completion_request(prompt, kwargs)))

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        return (_completion(r) for r in self._stream(self._completion_request(prompt, kwargs)))

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return _completion(await self._aanswer(self._completion_request(prompt, kwargs)))

    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False,
                               **kwargs: Any) -> CompletionResponseAsyncGen:
        stream = self._astream(self._completion_request(prompt, kwargs))

        async def gen() -> CompletionResponseAsyncGen:
            async for r in stream:
                yield _completion(r)

        return gen()

    # --- tools -----------------------------------------------------------------------------
    def _prepare_chat_with_tools(self, tools: Sequence[Any], user_msg: str | ChatMessage | None = None,
                                 chat_history: list[ChatMessage] | None = None, verbose: bool = False,
                                 allow_parallel_tool_calls: bool = False, tool_required: bool = False,
                                 **kwargs: Any) -> dict[str, Any]:
        messages = list(chat_history or [])
        if user_msg is not None:
            messages.append(ChatMessage(role=MessageRole.USER, content=user_msg) if isinstance(user_msg, str)
                            else user_msg)
        return {"messages": messages, "tools": [t.metadata.to_openai_tool() for t in tools],
                "tool_choice": "required" if tool_required else "auto", **kwargs}

    def _validate_chat_with_tools_response(self, response: ChatResponse, tools: Sequence[Any],
                                           allow_parallel_tool_calls: bool = False, **kwargs: Any) -> ChatResponse:
        """Without allow_parallel_tool_calls only the first call is kept (as LlamaIndex's other LLMs do)."""
        calls = response.message.additional_kwargs.get("tool_calls") or []
        if not allow_parallel_tool_calls and len(calls) > 1:
            response.message.additional_kwargs["tool_calls"] = calls[:1]
        return response

    # --- structured output: constrained decoding to the class's JSON schema ----------------------
    def structured_predict(self, output_cls: type[BaseModel], prompt: PromptTemplate,
                           llm_kwargs: dict[str, Any] | None = None, **prompt_args: Any) -> BaseModel:
        messages = prompt.format_messages(llm=self, **prompt_args)
        return validated(output_cls, self.chat(messages, **constrained_kwargs(output_cls, llm_kwargs)))

    async def astructured_predict(self, output_cls: type[BaseModel], prompt: PromptTemplate,
                                  llm_kwargs: dict[str, Any] | None = None, **prompt_args: Any) -> BaseModel:
        messages = prompt.format_messages(llm=self, **prompt_args)
        return validated(output_cls, await self.achat(messages, **constrained_kwargs(output_cls, llm_kwargs)))

    # LlamaIndex's stream_structured_predict / astream_structured_predict call these (and send its events)
    def _structured_stream_call(self, output_cls: type[BaseModel], prompt: PromptTemplate,
                                llm_kwargs: dict[str, Any] | None = None, **prompt_args: Any) -> Iterator[BaseModel]:
        messages = prompt.format_messages(llm=self, **prompt_args)
        return partial_objects(self.stream_chat(messages, **constrained_kwargs(output_cls, llm_kwargs)), output_cls)

    async def _structured_astream_call(self, output_cls: type[BaseModel], prompt: PromptTemplate,
                                       llm_kwargs: dict[str, Any] | None = None,
                                       **prompt_args: Any) -> AsyncIterator[BaseModel]:
        messages = prompt.format_messages(llm=self, **prompt_args)
        stream = await self.astream_chat(messages, **constrained_kwargs(output_cls, llm_kwargs))
        return apartial_objects(stream, output_cls)

    def get_tool_calls_from_response(self, response: ChatResponse, error_on_no_tool_call: bool = True,
                                     **kwargs: Any) -> list[ToolSelection]:
        calls = response.message.additional_kwargs.get("tool_calls", [])
        if not calls and error_on_no_tool_call:
            raise ValueError(f"the model answered without a tool call: {response.message.content!r}")
        return [ToolSelection(tool_id=c["id"], tool_name=c["function"]["name"],
                              tool_kwargs=_arguments(c["function"]["arguments"])) for c in calls]


class _ChatStream:
    """A stream's ChatResponses: the text so far at each delta, or with a required tool choice, the call so far
    (never content), as LlamaIndex's OpenAI LLM streams one; an "auto" answer's calls, usage and finish come once,
    at the end (parsing calls out of the whole text at every delta would cost O(n^2) per stream)."""

    def __init__(self, llm: InferPlug, prepared: Prepared) -> None:
        self.llm, self.prepared, self.builder, self.text, self.reasoning = llm, prepared, ResultBuilder(), "", ""
        self.forced = ForcedCallStream(prepared.tools) if prepared.tool_required else None
        self.name, self.arguments = None, ""  # the required call so far

    def step(self, event: Any) -> ChatResponse | None:
        self.builder.add(event)
        delta = event.text if event.index == 0 else ""
        if event.usage is not None:  # the request's last event
            result = self.builder.build()
            if self.forced is None or result.tool_calls:  # a remote backend's calls are whole
                return self.llm._response(result, self.prepared, delta=delta)
            return self.llm._response(result, self.prepared, delta="", call_id=self.forced.id)
        if not delta and not (event.index == 0 and event.reasoning):
            return None
        self.reasoning += event.reasoning
        thinking = {"thinking_delta": event.reasoning} if event.reasoning else {}
        if self.forced is not None:
            for piece in self.forced.feed(delta):
                self.name, self.arguments = self.name or piece.name, self.arguments + piece.arguments
            called = {"tool_calls": [_call_json(self.forced.id, self.name, self.arguments)]} if self.name else {}
            return ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, blocks=_blocks("", self.reasoning),
                                                    additional_kwargs=called), delta="", additional_kwargs=thinking)
        self.text += delta
        return ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, blocks=_blocks(self.text, self.reasoning)),
                            delta=delta, additional_kwargs=thinking)


def _call_json(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _arguments(text: str) -> dict[str, Any]:
    """A call's arguments; those of a call cut short (max_tokens) as far as they go, as LlamaIndex's OpenAI LLM
    reads them."""
    try:
        value = parse_partial_json(text)
    except (ValueError, TypeError):
        return {}
    return value if isinstance(value, dict) else {}


def _blocks(text: str, reasoning: str) -> list[Any]:
    """A message's blocks: a ThinkingBlock for a reasoning model's think text, then the answer."""
    return [*([ThinkingBlock(content=reasoning)] if reasoning else []), TextBlock(text=text)]


def _logprobs(entries: list[TokenLogprob] | None) -> list[list[LogProb]] | None:
    """Per generated token: its top alternatives (the sampled one among them), or the sampled token alone."""
    if entries is None:
        return None
    return [[_logprob(t, lp) for _, t, lp in e.top] or [_logprob(e.token, e.logprob)] for e in entries]


def _logprob(token: str, logprob: float) -> LogProb:
    return LogProb(token=token, logprob=logprob, bytes=list(token.encode()))


def _completion(r: ChatResponse) -> CompletionResponse:
    return CompletionResponse(text=r.message.content or "", delta=r.delta, raw=r.raw,
                              additional_kwargs=r.message.additional_kwargs)
