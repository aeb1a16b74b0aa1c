"""The ExLlamaV2 backend: EXL2 and GPTQ models on CUDA, through ExLlamaV2's dynamic generator.

The generator brings continuous batching over a paged cache, deduplication of shared prompt
pages (n > 1 choices and common prefixes share them), cancellation, and speculative decoding
with an n-gram or a small draft model. `exllamav2` is imported only here and only when the
backend is built: importing it compiles a CUDA extension, which fails without a GPU. The
generator's thread (exl2_worker) sends each step's raw tokens straight into the caller's EventChannel;
the output stage runs on the caller's side as it reads them (backends/local_stream.py).
"""

from __future__ import annotations

import asyncio
import json
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferplug.backends.bridge import EventChannel
from inferplug.backends.exl2_worker import GeneratorWorker, Submitted
from inferplug.backends.local_stream import LocalBackend, LocalRequest
from inferplug.errors import BackendUnavailable
from inferplug.types import Capabilities, Event, Request, SamplingParams

if TYPE_CHECKING:
    from inferplug.profile import Profile
    from inferplug.plan import Plan

PAGE_SIZE = 256  # ExLlamaV2's paged cache is sized in 256-token pages
_CACHE_CLASSES = {"FP16": "ExLlamaV2Cache", "Q4": "ExLlamaV2Cache_Q4", "Q6": "ExLlamaV2Cache_Q6",
                  "Q8": "ExLlamaV2Cache_Q8"}


def import_exllamav2() -> Any:
    try:
        import exllamav2
        import exllamav2.generator
    except Exception as exc:  # ImportError, or the CUDA extension failing to build or load
        raise BackendUnavailable(
            f"the exllamav2 backend cannot start ({type(exc).__name__}: {exc}); it needs a CUDA GPU and "
            "pip install 'inferplug[exllamav2]'. Use the native backend otherwise"
        ) from exc
    return exllamav2


class ExLlamaV2Backend(LocalBackend):
    name = "exllamav2"

    def __init__(self, profile: Profile, plan: Plan) -> None:
        super().__init__(profile, plan)
        exl = import_exllamav2()
        from inferplug.models.loader import load_tokenizer
        from inferplug.sources import ensure_local

        source = ensure_local(profile.model)
        opts = profile.exllamav2
        self.config, model, cache = _load(exl, source, plan.max_model_len, _cache_tokens(plan), opts)
        draft_model, draft_cache = None, None
        if opts.draft_model:
            _, draft_model, draft_cache = _load(exl, ensure_local(_source_of(opts.draft_model)),
                                                self.config.max_seq_len, cache.max_seq_len, opts)
        generator = exl.generator.ExLlamaV2DynamicGenerator(
            model=model, cache=cache, tokenizer=exl.ExLlamaV2Tokenizer(self.config),
            max_batch_size=plan.max_num_seqs, max_seq_len=self.config.max_seq_len,
            draft_model=draft_model, draft_cache=draft_cache,
            num_draft_tokens=opts.max_draft or 4, use_ngram_draft=opts.max_draft > 0 and draft_model is None,
            paged=plan.attention == "flash",  # paged attention is flash-attn's; without it, one job at a time
        )
        self._exl = exl
        self._model = model
        self._tokenizer = load_tokenizer(source, profile.model.tokenizer)
        self._worker = GeneratorWorker(generator)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(n=True)

    @property
    def context_length(self) -> int:
        return self.config.max_seq_len

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def _start(self, request: Request, channel: EventChannel) -> None:
        local = LocalRequest.start(self, request, self._eos_ids(), min_p=True, presence_penalty=True,
                                   frequency_penalty=True, top_logprobs=True)
        params = request.params
        jobs = [self._job(local.ids, params, local.limit, local.end_ids, i) for i in range(params.n)]
        local.read_on(channel, partial(self._events, local, request.request_id))
        self._worker.add(Submitted(request.request_id, jobs, channel))

    def _events(self, local: LocalRequest, request_id: str, item: tuple) -> list[Event]:
        """One raw item's events (the consumer's output stage, local_stream.LocalRequest.read)."""
        kind, index, payload, at = item
        if kind == "eos":
            local.cached_tokens = max(local.cached_tokens, payload.get("cached_tokens", 0))
        choice = local.choices[index]
        if choice.done:
            return []
        if kind == "abort":
            return [choice.finish("abort", at=at)]
        if kind == "tokens":
            out = [choice.on_token(token, logprob, top, at=at) for token, logprob, top in payload if not choice.done]
            if choice.done:  # ended here (a stop string, the length): free its pages now
                self._worker.cancel(request_id, index)
            return out
        if payload["eos_reason"] == "error":
            return [choice.finish("error", payload["error"], at=at)]
        out = [choice.on_token(t, at=at) for t in payload["held_ids"] if not choice.done]
        if choice.done:
            return out
        return [*out, choice.finish("length" if payload["eos_reason"] == "max_new_tokens" else "stop", at=at)]

    async def abort(self, request_id: str) -> None:
        await asyncio.wrap_future(self._worker.cancel(request_id))

    def cancel_now(self, request_id: str) -> None:
        self._worker.cancel(request_id).result()

    def stats(self) -> dict[str, Any]:
        return self._worker.stats()

    def close(self) -> None:
        """Later requests are refused; open ones end with BackendUnavailable, their pages freed, before the model
        is unloaded. The worker is kept: a late cancel returns at once."""
        if self.closed:
            return
        super().close()
        if getattr(self, "_worker", None) is not None:
            self._worker.close()
            self._model.unload()

    # --- helpers --------------------------------------------------------------------
    def _eos_ids(self) -> list[int]:
        eos = self.config.eos_token_id
        return [t for t in (eos if isinstance(eos, list) else [eos]) if t is not None]

    def _job(self, ids: list[int], params: SamplingParams, limit: int, end_ids: set[int], index: int) -> Any:
        import torch

        seed = None if params.seed is None else params.seed + index
        # With drafting, the generator stops num_draft_tokens short of max_new_tokens; the
        # choice stream ends the job at `limit` itself.
        draft = self._worker.generator.num_draft_tokens
        return self._exl.generator.ExLlamaV2DynamicJob(
            input_ids=torch.tensor([ids], dtype=torch.long), max_new_tokens=limit + draft,
            min_new_tokens=params.min_tokens,
            gen_settings=_sampler_settings(self._exl, params), seed=seed,
            stop_conditions=sorted(end_ids),
            return_probs=params.logprobs is not None, return_top_tokens=params.logprobs or 0,
            identifier=index,
        )


def _sampler_settings(exl: Any, p: SamplingParams) -> Any:
    settings = exl.generator.ExLlamaV2Sampler.Settings
    # ExLlamaV2 counts presence and frequency over the whole sequence, prompt included (OpenAI: output only)
    penalties = dict(token_repetition_penalty=p.repetition_penalty, token_presence_penalty=p.presence_penalty,
                     token_frequency_penalty=p.frequency_penalty)
    if p.greedy:
        return settings.greedy(**penalties)
    return settings(temperature=p.temperature, top_k=max(p.top_k, 0), top_p=p.top_p, min_p=p.min_p, **penalties)


def rope_theta_of(model_dir: Path) -> float | None:
    """rope_theta from config.json, top level (transformers 4) or inside rope_parameters (transformers 5)."""
    raw = json.loads((model_dir / "config.json").read_text())
    for table in (raw, raw.get("text_config") or {}):
        theta = table.get("rope_theta") or (table.get("rope_parameters") or {}).get("rope_theta")
        if theta:
            return float(theta)
    return None


def _load(exl: Any, model_dir: Path, max_seq_len: int, cache_tokens: int, opts: Any) -> tuple[Any, Any, Any]:
    """Config, model and cache of one EXL2/GPTQ dir, loaded across the GPUs."""
    config = exl.ExLlamaV2Config(str(model_dir))
    theta = rope_theta_of(model_dir)
    if theta is not None:  # ExLlamaV2Config reads only a top-level rope_theta
        config.rotary_embedding_base = theta
    if max_seq_len:
        config.max_seq_len = min(config.max_seq_len, max_seq_len)
    config.arch_compat_overrides()
    model = exl.ExLlamaV2(config)
    cache_class = getattr(exl, _CACHE_CLASSES[opts.cache_mode])
    size = max(cache_tokens, _round_up(config.max_seq_len))
    if opts.gpu_split:
        model.load(gpu_split=opts.gpu_split, progress=True)
        cache = cache_class(model, max_seq_len=size)
    else:
        cache = cache_class(model, max_seq_len=size, lazy=True)
        model.load_autosplit(cache, progress=True)
    return config, model, cache


def _cache_tokens(plan: Plan) -> int:
    return (plan.num_kv_blocks * plan.block_size) // PAGE_SIZE * PAGE_SIZE


def _round_up(tokens: int) -> int:
    return -(-tokens // PAGE_SIZE) * PAGE_SIZE


def _source_of(text: str) -> Any:
    from inferplug.sources import parse_source

    return parse_source(text)
