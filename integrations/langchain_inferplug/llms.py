"""InferPlugLLM: a LangChain text-completion LLM; `generate`/`batch` submit all prompts at once."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseLLM
from langchain_core.outputs import Generation, GenerationChunk, LLMResult

from inferplug.frontend.binding import usage_counts
from inferplug.frontend.calls import Result, generate_all
from inferplug.frontend.openai_logprobs import vllm_prompt_logprobs
from inferplug.frontend.requests import build_request
from langchain_inferplug.base import InferPlugFields


class InferPlugLLM(InferPlugFields, BaseLLM):
    """`InferPlugLLM(profile="smollm2-135m")`: plain prompts in, text out."""

    def _request(self, prompt: str, stop: list[str] | None, kwargs: dict[str, Any]) -> Any:
        return build_request(self.backend, options=self._options(stop, kwargs), prompt=prompt,
                             response_format=kwargs.get("response_format"), documents=kwargs.get("documents"),
                             memory=self.document_memory).request

    def _generation(self, result: Result) -> list[Generation]:
        info = {"finish_reason": result.finish_reason, "model_name": self.model, "usage": usage_counts(result.usage)}
        if result.prompt_logprobs is not None:  # the call's prompt_logprobs=k, in vLLM's shape
            info["prompt_logprobs"] = vllm_prompt_logprobs(result.prompt_logprobs)
        return [Generation(text=result.text, generation_info=info)]

    def _generate(self, prompts: list[str], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> LLMResult:
        requests = [self._request(p, stop, kwargs) for p in prompts]
        results = generate_all(self.backend, requests)
        return LLMResult(generations=[self._generation(r) for r in results], llm_output={"model_name": self.model})

    async def _agenerate(self, prompts: list[str], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None, **kwargs: Any) -> LLMResult:
        import asyncio

        from inferplug.frontend.calls import acollect

        requests = [self._request(p, stop, kwargs) for p in prompts]
        results = await asyncio.gather(*(acollect(self.backend, r) for r in requests))
        return LLMResult(generations=[self._generation(r) for r in results], llm_output={"model_name": self.model})

    def _stream(self, prompt: str, stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> Iterator[GenerationChunk]:
        for event in self.backend.stream_sync(self._request(prompt, stop, kwargs)):
            if event.index == 0 and (event.text or event.finish_reason):
                chunk = GenerationChunk(text=event.text, generation_info=_finish_info(event))
                if run_manager:
                    run_manager.on_llm_new_token(event.text, chunk=chunk)
                yield chunk

    async def _astream(self, prompt: str, stop: list[str] | None = None,
                       run_manager: AsyncCallbackManagerForLLMRun | None = None,
                       **kwargs: Any) -> AsyncIterator[GenerationChunk]:
        async for event in self.backend.stream_async(self._request(prompt, stop, kwargs)):
            if event.index == 0 and (event.text or event.finish_reason):
                chunk = GenerationChunk(text=event.text, generation_info=_finish_info(event))
                if run_manager:
                    await run_manager.on_llm_new_token(event.text, chunk=chunk)
                yield chunk


def _finish_info(event: Any) -> dict[str, Any] | None:
    return {"finish_reason": event.finish_reason} if event.finish_reason else None
