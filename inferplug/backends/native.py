"""The `native` backend: our paged, continuously batching engine behind the Backend protocol."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import AsyncIterator
from functools import cached_property, partial
from typing import TYPE_CHECKING, Any

from inferplug.backends.base import Backend
from inferplug.compute_path_plan import ONEDNN_ISA_ENV
from inferplug.backends.passing_thread import in_a_passing_thread
from inferplug.types import Capabilities, Event, Request

if TYPE_CHECKING:
    from inferplug.engine.llm_engine import LLMEngine
    from inferplug.profile import Profile
    from inferplug.plan import Plan


def build_engine(profile: Profile, plan: Plan, *, split_reasoning: bool = False) -> LLMEngine:
    """Load the profile's model (pulling it on first use) into an LLMEngine sized by the plan. split_reasoning: the
    output stage moves a reasoning model's think text to Event.reasoning (the Backend's events); False keeps it in
    the text (the offline LLM, as vLLM's)."""
    import torch

    from inferplug.chat_template import profile_template, reasoning_parser, render_chat
    from inferplug.engine.llm_engine import LLMEngine
    from inferplug.models.loader import load_tokenizer, load_weights, read_config
    from inferplug.sources import ensure_local

    if plan.onednn_max_isa:  # AMX refused here (compute_path_plan.onednn_max_isa): before oneDNN's first matmul
        os.environ.setdefault(ONEDNN_ISA_ENV, plan.onednn_max_isa)
    native = getattr(profile, "native", None)
    if native is not None and native.num_threads and plan.device == "cpu":
        torch.set_num_threads(native.num_threads)
    spec = profile.speculative
    config = dataclasses.replace(engine_config(plan), speculative_method=spec.method, num_speculative_tokens=spec.num_tokens,
                                 ngram_min=spec.ngram_min, ngram_max=spec.ngram_max,
                                 rag_recompute=profile.cache.rag_recompute,  # engine/rag_recompute.py
                                 rag_recompute_fraction=profile.cache.rag_recompute_fraction,
                                 schedule=profile.cache.schedule)  # engine/cache_aware.py
    path = plan.model_path or ensure_local(profile.model)  # the plan's, when the model was already on disk
    config = dataclasses.replace(config, **doc_disk_settings(profile, plan, path))
    tokenizer = load_tokenizer(path, profile.model.tokenizer)
    # under tensor parallel each rank moves its own shard to its device: loading there would put it all on cuda:0
    load_device = "cpu" if config.tensor_parallel_size > 1 else config.device
    weights = load_weights(path, config.torch_dtype, load_device, profile.quantization.format,
                           gguf_layers=gguf_layer_format(plan, config.tensor_parallel_size),
                           load_format=profile.model.load_format)
    # the model is built in config's weight_format and prefill_gemm (every rank's, a draft's), then its KV pools
    return LLMEngine(read_config(path), weights, tokenizer, config, draft=load_draft(spec.draft_model, config),
                     render_chat=partial(render_chat, tokenizer, profile_template(profile)),
                     reasoning_parser=reasoning_parser(profile, tokenizer) if split_reasoning else None)


def doc_disk_settings(profile: Profile, plan: Plan, path) -> dict[str, Any]:
    """The EngineConfig fields of the document KV disk tier, from [cache] (engine/doc_disk_key.py keys it)."""
    from inferplug.engine.doc_disk_key import model_identity
    from inferplug.sources import home

    cache = profile.cache
    if not cache.rag_disk_bytes():
        return {"rag_shared_salt": cache.rag_shared_salt}
    return {"rag_disk_dir": str(home() / cache.rag_disk_dir.expanduser()), "rag_disk_bytes": cache.rag_disk_bytes(),
            "rag_shared_salt": cache.rag_shared_salt,
            "model_identity": model_identity(path, profile.model.load_format, plan.weight_format, plan.prefill_gemm)}


def gguf_layer_format(plan: Plan, tensor_parallel_size: int) -> str | None:
    """The block format a GGUF's matrices load straight into (models/gguf_layers.py), so that no float copy of them is
    made: the plan's where the CPU kernels run one process; on one GPU "mxfp4" (gpt-oss's MXFP4 experts as blocks,
    for the Triton grouped GEMM, the rest float); None loads them float for quantize_model (tensor parallel, or a CPU
    without the kernels)."""
    from inferplug.kernels import cpu as cpu_kernels
    from inferplug.quant.formats import GGUF_LAYER_FORMATS

    if tensor_parallel_size == 1 and plan.device != "cpu":
        return "mxfp4"
    on_kernels = tensor_parallel_size == 1 and cpu_kernels.runs_on(plan.device)
    return plan.weight_format if on_kernels and plan.weight_format in GGUF_LAYER_FORMATS else None


def load_draft(source, config):
    """The [speculative] draft model (engine/draft.py), pulled like [model]; None when there is none."""
    if source is None:
        return None
    from inferplug.engine.draft import DraftModel
    from inferplug.models.loader import load_tokenizer, load_weights, read_config
    from inferplug.sources import ensure_local

    path = ensure_local(source)
    return DraftModel(read_config(path), load_weights(path, config.torch_dtype, config.device),
                      load_tokenizer(path, source.tokenizer))


def engine_config(plan: Plan):
    """The EngineConfig every field of the plan that the engine runs by sets (tests/test_plan_fields.py)."""
    from inferplug.engine.config import EngineConfig
    return EngineConfig(
        dtype=plan.dtype, device=plan.device, block_size=plan.block_size, num_kv_blocks=plan.num_kv_blocks,
        max_model_len=plan.max_model_len or None, max_num_seqs=plan.max_num_seqs,
        max_num_batched_tokens=plan.max_num_batched_tokens, enable_prefix_caching=plan.prefix_caching,
        max_prefill_tokens_while_decoding=plan.max_prefill_tokens_while_decoding,
        rag_document_cache=plan.rag_document_cache,  # doc_cache: the profile's [cache] rag_document_cache
        attention=plan.attention, kv_dtype=plan.kv_dtype,
        # weight-only fp16/int8/int4 (quant/linear.py): decode is memory-bound, so fewer weight bytes per step
        weight_format=plan.weight_format, prefill_gemm=plan.prefill_gemm,
        tensor_parallel_size=plan.tensor_parallel_size, threads_per_rank=plan.threads_per_rank,  # engine/parallel
    )


def engine_capabilities(engine: LLMEngine) -> Capabilities:
    """What the native engine can do: the request builder's checks for the native backend and the offline LLM."""
    import importlib.util

    return Capabilities(
        n=True, tools=True, beam_search=True, prompt_logprobs=True,
        rag_cache=engine.doc_cache is not None,  # doc_cache: engine/doc_cache.py
        json_schema=importlib.util.find_spec("xgrammar") is not None,  # engine/guided.py needs it
    )


class NativeBackend(Backend):
    name = "native"

    def __init__(self, profile: Profile, plan: Plan) -> None:
        from inferplug.backends.async_engine import AsyncEngine

        super().__init__(profile, plan)
        from inferplug.kernels import cpu as cpu_kernels

        cpu_kernels.runs_on(plan.device)  # a first build compiles here: Ctrl-C then still unwinds its lock file
        # loaded in a thread that ends, so that the step thread's OpenMP pool is the only one (backends/passing_thread.py)
        self.engine = AsyncEngine(in_a_passing_thread(partial(build_engine, profile, plan, split_reasoning=True),
                                                      "inferplug-load"))
        # the step thread feeds the channels itself, no hop through a loop: the Backend's submit is the engine's
        self.submit, self.cancel_now = self.engine.submit, self.engine.abort_now

    @cached_property  # fixed once the engine is built: read on every request
    def capabilities(self) -> Capabilities:
        return engine_capabilities(self.engine.engine)

    @property
    def reasoning_parser(self) -> str | None:
        return self.engine.engine.reasoning_parser  # build_engine's

    @property
    def context_length(self) -> int:
        return self.engine.engine.max_model_len

    @cached_property
    def tokenizer(self) -> Any:
        return self.engine.engine.tokenizer

    def generate(self, request: Request) -> AsyncIterator[Event]:
        return self.engine.generate(request)

    async def abort(self, request_id: str) -> None:
        await self.engine.abort(request_id)

    def stats(self) -> dict[str, Any]:
        return self.engine.stats()

    def health(self) -> str | None:
        return self.engine.failure

    def evict_documents(self, docs: list[Any] | None = None, salt: str | None = None) -> int:
        return self.engine.evict_documents(docs, salt)

    def close(self) -> None:
        self.engine.close()
        super().close()
