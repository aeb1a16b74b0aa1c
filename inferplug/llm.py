"""The offline API, shaped like vLLM's quick start:

    from inferplug import LLM, SamplingParams
    llm = LLM(profile="smollm2-135m")
    for out in llm.generate(["Hello, my name is"], SamplingParams(temperature=0.8, top_p=0.95)):
        print(out.outputs[0].text)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferplug.chat_template import chat_template_text
from inferplug.errors import ProfileError, RequestError
from inferplug.frontend.requests import build_request
from inferplug.stages.prompt import EncodedPrompt
from inferplug.types import Event, Request, SamplingParams, Timings, TokenLogprob, Usage


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    beam_score: float | None = None  # use_beam_search: the returned beam's score (transformers' sequences_scores)


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    usage: Usage | None = None
    metrics: Timings | None = None
    finished: bool = False
    # SamplingParams.prompt_logprobs: per prompt token (None for the first), as vLLM's RequestOutput has them
    prompt_logprobs: list[TokenLogprob | None] | None = None

    def add(self, event: Event) -> None:
        if event.prompt_logprobs is not None:
            self.prompt_logprobs = event.prompt_logprobs
        choice = self.outputs[event.index]
        choice.text += event.text
        choice.token_ids += event.token_ids
        if event.logprobs is not None:
            choice.logprobs = (choice.logprobs or []) + event.logprobs
        if event.finish_reason is not None:
            choice.finish_reason, choice.stop_reason = event.finish_reason, event.stop_reason
            choice.beam_score = event.beam_score
        if event.usage is not None:
            self.usage, self.metrics, self.finished = event.usage, event.timings, True


class LLM:
    """A model loaded from a profile, generating in batches with continuous batching underneath.

    This is the native engine's offline API (its outputs carry the engine's token ids, steps and usage). A profile
    that resolves to another backend is refused with the way to reach it: get_backend, as every front end does.
    Its requests go through the one request builder (frontend/requests.py), which reads of it what it reads of a
    backend: name, profile, capabilities and tokenizer."""

    name = "native"

    def __init__(self, profile: str | Path | Any = None, **engine_overrides: Any):
        from inferplug.backends.native import build_engine, engine_capabilities
        from inferplug.hardware import probe
        from inferplug.profile import load_profile
        from inferplug.resolver import resolve

        self.profile = load_profile(profile)
        plan = resolve(self.profile, probe())
        if plan.backend != "native":
            raise ProfileError(
                f"LLM() is the native engine's offline API, but profile {self.profile.served_name!r} resolves to the "
                f"{plan.backend!r} backend here; use inferplug.backends.registry.get_backend(profile) (the Backend "
                "protocol every front end uses) for it, or set backend = \"native\" in the profile")
        for key, value in engine_overrides.items():  # e.g. dtype="bfloat16", num_kv_blocks=512
            if not hasattr(plan, key):
                known = sorted(f.name for f in dataclasses.fields(plan))
                raise ProfileError(f"LLM() got an unknown engine option {key!r}; known: {', '.join(known)}")
            setattr(plan, key, value)
        self.engine = build_engine(self.profile, plan)
        self.capabilities, self.tokenizer = engine_capabilities(self.engine), self.engine.tokenizer
        self._counter = 0

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    def generate(self, prompts: str | list[int] | list[str | list[int]],
                 sampling_params: SamplingParams | list[SamplingParams] | None = None) -> list[RequestOutput]:
        """One output per prompt (text or token ids), in order. RequestError, before any runs, if any prompt is
        invalid. Without sampling params, the profile's [sampling] values (as the request builder sets them)."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        return self._run(self._prepare([{"prompt": p} for p in prompts], sampling_params))

    def chat(self, messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
             sampling_params: SamplingParams | list[SamplingParams] | None = None,
             tools: list[dict[str, Any]] | None = None) -> list[RequestOutput]:
        """Chat conversations rendered by the model's (or profile's) chat template; `tools` as the request builder
        takes them (OpenAI tool schemas)."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        return self._run(self._prepare([{"messages": list(m), "tools": tools} for m in conversations],
                                       sampling_params))

    def precompute_documents(self, docs: list[Any], salt: str | None = None) -> int:
        """Compute and store each document's KV now, at indexing time (TurboRAG; rag/precompute.py): in memory,
        and on disk with a [cache] rag_disk_size, so later queries here or in a restarted process reuse it.
        salt: the salt the corpus is served under (a tenant's, for its private corpus); None: the profile's
        [cache] rag_shared_salt. Returns the documents computed."""
        from inferplug.rag.precompute import precompute_request

        salt = salt if salt is not None else self.profile.cache.rag_shared_salt
        chat = chat_template_text(self.profile, self.tokenizer) is not None
        encoded = [(r, self.engine.encode(r)) for r in (precompute_request(d, salt, chat) for d in docs)]
        placed = [(r, prompt) for r, prompt in encoded if prompt.documents]  # found verbatim in the rendered text
        self._run(placed)
        return len(placed)

    def evict_documents(self, docs: list[Any] | None = None, salt: str | None = None) -> int:
        """Drop the documents' stored KV under `salt`, in memory and on disk; docs None: every document of that
        salt. Returns the entries dropped."""
        cache = self.engine.doc_cache
        return cache.evict(docs, salt) if cache is not None else 0

    def stats(self) -> dict[str, Any]:
        """The engine's counters: KV blocks, prefix and document cache hits, bytes in memory and on disk."""
        return self.engine.stats()

    def _prepare(self, calls: list[dict[str, Any]], given) -> list[tuple[Request, EncodedPrompt]]:
        """Each call's Request from the request builder, with a SamplingParams given taken whole (as vLLM's) or else
        the profile's [sampling], and its prompt encoded; RequestError, before any runs, if one is invalid."""
        params = given if isinstance(given, list) else [given] * len(calls)
        if len(params) != len(calls):
            raise RequestError(f"got {len(params)} sampling params for {len(calls)} prompts; give one or one each",
                               param="sampling_params")
        requests = [build_request(self, params=p, **call).request for p, call in zip(params, calls)]
        return [(request, self.engine.encode(request)) for request in requests]

    def _run(self, prompts: list[tuple[Request, EncodedPrompt]]) -> list[RequestOutput]:
        outputs: dict[str, RequestOutput] = {}
        try:
            for request, prompt in prompts:
                request.request_id = f"llm-{self._counter}"
                self._counter += 1
                self.engine.add_request(request, prompt)
                choices = [CompletionOutput(i) for i in range(request.params.n)]
                outputs[request.request_id] = RequestOutput(request.request_id, prompt.text, prompt.ids, choices)
            while self.engine.has_unfinished():
                for event in self.engine.step():
                    outputs[event.request_id].add(event)
        finally:
            for request_id in list(outputs):
                self.engine.abort(request_id)  # only after an error: finished ids are gone already
        return list(outputs.values())
