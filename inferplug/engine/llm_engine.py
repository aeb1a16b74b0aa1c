"""LLMEngine: requests in, Events out, one `step()` at a time (synchronous; AsyncEngine wraps it).

A step has two parts. `step_tokens` schedules, runs the model, samples, and ends the sequences that a token's id
ends (EOS, a stop token id, the grammar's end, the length): it returns the output stage's work as closures, which
`outputs` runs (detokenizing, stop strings, the reasoning split, logprobs, usage). `step` runs both; AsyncEngine runs
the second on its step thread after the first, outside the engine's lock (an abort or an eviction may come between
them). A stop string found there ends its sequence at the start of the next `step_tokens` (`text_stopped`).
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from inferplug.engine.block_manager import BlockManager
from inferplug.engine.config import EngineConfig
from inferplug.engine.doc_cache import DocumentKVCache
from inferplug.engine.doc_disk_key import open_disk_tier
from inferplug.engine.draft import DraftModel, check_draft
from inferplug.engine.model_runner import ModelRunner
from inferplug.engine.rag_recompute import DEVIATION_LAYER, RecomputePolicy
from inferplug.engine.request_state import RequestState, validate_beam_search, validate_prompt
from inferplug.engine.sampler import SampleResult, Sampler
from inferplug.engine.scheduler import Scheduler
from inferplug.engine.sequence import Sequence
from inferplug.engine.spec_decode import make_proposer
from inferplug.engine.spec_verify import spec_stats
from inferplug.engine.state_snapshots import StateSnapshots
from inferplug.engine.window_blocks import WindowBlocks
from inferplug.errors import GenerationError, ProfileError, RequestError
from inferplug.kernels.delta_rule_ref import CHUNK as DELTA_CHUNK
from inferplug.models.config import ModelConfig, window_pool_blocks
from inferplug.models.registry import family, runs_document_cache
from inferplug.stages.prompt import EncodedPrompt, encode_prompt
from inferplug.types import Event, FinishReason, Request, SamplingParams

Outputs = list[Callable[[], list[Event]]]  # a step's output-stage work, run in order (LLMEngine.outputs)


class LLMEngine:
    def __init__(
        self, model_config: ModelConfig, state_dict: dict[str, torch.Tensor], tokenizer: Any,
        config: EngineConfig | None = None, *, render_chat: Callable[..., str] | None = None,
        draft: DraftModel | None = None, reasoning_parser: str | None = None,
    ):
        """`draft`: the model that proposes tokens when config.speculative_method is "draft" (engine/draft.py).
        `reasoning_parser`: the output stage's parser for think text (stages/reasoning.py; None: no split)."""
        from inferplug.models.decoder import DecoderModel

        self.config = config = config or EngineConfig()
        self.model_config, self.tokenizer = model_config, tokenizer
        self.render_chat = render_chat
        self.reasoning_parser = reasoning_parser
        limit = min(model_config.max_position_embeddings, config.num_kv_blocks * config.block_size)
        if model_config.sliding_window:  # we attend to the full context, which is exact only inside the window
            limit = min(limit, model_config.sliding_window)
        self.max_model_len = min(config.max_model_len or limit, limit)
        self.eos_token_ids = set(model_config.eos_token_ids)
        if not self.eos_token_ids and getattr(tokenizer, "eos_token_id", None) is not None:
            self.eos_token_ids = {tokenizer.eos_token_id}
        if draft is not None:
            check_draft(model_config, tokenizer, draft, self.max_model_len)
        # a hybrid model's DeltaNet layers keep a state per running sequence: a prefix hit needs a snapshot of it
        self.recurrent_why = recurrent_why = family(model_config.family).recurrent_why
        state_slots = config.max_num_seqs if recurrent_why else 0
        if recurrent_why and config.speculative_method != "none":
            raise ProfileError(f"speculative decoding does not run on {model_config.family}: {recurrent_why}; set "
                               "[speculative] method = \"none\"")
        # the document cache keeps every layer's KV of a document; else the sliding-window layers keep only a window's
        doc_cache = runs_document_cache(config.rag_document_cache, model_config.family, config.tensor_parallel_size)
        window = 0 if doc_cache else model_config.kv_window()
        step_tokens = max(config.max_num_batched_tokens, config.block_size)
        self.config = config = dataclasses.replace(config, window_kv_blocks=window and window_pool_blocks(
            window, config.block_size, config.max_num_seqs, step_tokens, config.num_kv_blocks))
        window_group = WindowBlocks(config.window_kv_blocks, config.block_size, window, config.enable_prefix_caching) \
            if window else None
        self.blocks = BlockManager(config.num_kv_blocks, config.block_size, config.enable_prefix_caching,
                                   window=window_group)
        sampler = Sampler(sorted(self.eos_token_ids))
        if config.tensor_parallel_size > 1:  # rank 0 here, the other ranks in their own processes
            from inferplug.engine.parallel.runner import ParallelRunner

            self.runner = ParallelRunner(model_config, state_dict, config, sampler=sampler,
                                         threads_per_rank=config.threads_per_rank)
        else:
            model = DecoderModel(model_config, state_dict, dtype=config.torch_dtype, device=config.device,
                                 attention=config.attention, kv_dtype=config.torch_kv_dtype,
                                 max_positions=self.max_model_len, weight_format=config.weight_format)
            # decode steps per batch-size bucket (not over DeltaNet states)
            graphs = config.cuda_graphs and config.device.startswith("cuda") and not recurrent_why
            self.runner = ModelRunner(model, num_blocks=config.num_kv_blocks, block_size=config.block_size,
                                      sampler=sampler, max_num_seqs=config.max_num_seqs if graphs else 0,
                                      max_model_len=self.max_model_len, weight_format=config.weight_format,
                                      prefill_gemm=config.prefill_gemm, state_slots=state_slots,
                                      window_blocks=config.window_kv_blocks)
        # RAG document KV reuse (engine/doc_cache.py), a prefix source the scheduler asks; inert without
        # Request.documents. Not under tensor parallel: it copies KV on rank 0 only, which holds a slice of the heads;
        # nor for a family it does not take (rag_cache_plan.py says why).
        self.doc_cache = None
        if doc_cache:
            disk = open_disk_tier(config, model_config, self.runner.kv_caches[0][0].dtype)  # None: memory only
            self.doc_cache = DocumentKVCache(self.runner.model, self.runner.kv_caches, config.block_size, tokenizer,
                                             disk=disk, shared_salt=config.rag_shared_salt)
        self.snapshots = None  # a hybrid model's prefix cache: its DeltaNet states at 64-token points
        if recurrent_why and config.enable_prefix_caching and config.state_snapshots:
            self.snapshots = StateSnapshots(self.runner, math.lcm(DELTA_CHUNK, config.block_size), config.block_size,
                                            config.state_snapshots)
        self.proposer = make_proposer(config, draft, sorted(self.eos_token_ids))  # a draft runs on rank 0 whole
        self.kv_pools = (self.blocks, *(self.proposer.pools if self.proposer else ()))  # a draft model's too
        self.scheduler = Scheduler(
            self.blocks, max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=step_tokens,
            max_prefill_tokens_while_decoding=config.max_prefill_tokens_while_decoding,
            prefix_source=self.doc_cache, proposer=self.proposer,
            recompute=RecomputePolicy(config.rag_recompute, config.rag_recompute_fraction,
                                      min(DEVIATION_LAYER, model_config.num_hidden_layers - 1)),
            schedule=config.schedule, state_slots=state_slots, state_chunk=DELTA_CHUNK if recurrent_why else 0,
            snapshots=self.snapshots,
        )
        self.requests: dict[str, RequestState] = {}
        self.text_stopped: deque[Sequence] = deque()  # ended by a stop string in the output stage, still scheduled

    # --- requests ---------------------------------------------------------------
    def encode(self, request: Request) -> EncodedPrompt:
        """The prompt's token ids, its text when it had one and its documents' spans there, by the prompt stage
        (stages/prompt.py). Raises RequestError on bad input."""
        return encode_prompt(self.tokenizer, self.render_chat, request, self.max_model_len)

    def add_request(self, request: Request, prompt: EncodedPrompt | None = None, *, score_from: int = 0) -> None:
        """prompt: encode(request)'s, when the caller has it (a prompt worker). score_from (prompt_logprob_rows): the
        first prompt row scored; prompt's text and documents then cover the tokens up to it."""
        if request.request_id in self.requests:
            raise RequestError(f"request id {request.request_id!r} is already running; use a new id", param="request_id")
        prompt_ids, text, documents = prompt if prompt is not None else self.encode(request)
        validate_prompt(prompt_ids, request.params, self.model_config.vocab_size, self.max_model_len)
        validate_beam_search(request.params, max_num_seqs=self.config.max_num_seqs,
                             max_step_tokens=self.scheduler.max_num_batched_tokens, num_blocks=self.blocks.num_blocks,
                             speculative=self.scheduler.proposer is not None, block_size=self.blocks.block_size,
                             max_seq_len=min(len(prompt_ids) + (request.params.max_tokens or self.max_model_len),
                                             self.max_model_len), recurrent_why=self.recurrent_why)
        state = RequestState.create(request, prompt_ids, self.max_model_len, self.tokenizer, self.config.device,
                                    self.eos_token_ids, self.reasoning_parser)
        first, *rest = state.seqs
        first.score_from = score_from
        if self.doc_cache is not None and (request.params.prompt_logprobs is None or score_from):
            # map document spans to tokens (not where logprobs are scored: a document's KV from the cache has none)
            self.doc_cache.plan(first, text, documents, covered=score_from + 1 if score_from else len(prompt_ids))
        self.scheduler.add(first, siblings=[] if state.beams else rest)  # beams join by forking from the first
        self.requests[request.request_id] = state  # only now: a request that failed above must not linger

    def abort(self, request_id: str) -> list[Event]:
        return self.outputs(self.abort_tokens(request_id))

    def abort_tokens(self, request_id: str) -> Outputs:
        """End the request now (its blocks back in the pool); the output stage's closing events to run."""
        state = self.requests.get(request_id)
        if state is None:
            return []
        return [self._finish(seq, state, "abort") for seq in state.seqs if not seq.is_finished]

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    # --- one step ---------------------------------------------------------------
    def step(self) -> list[Event]:
        events = self.outputs(self.step_tokens())
        self.end_text_stopped()
        return events

    def outputs(self, work: Outputs) -> list[Event]:
        """Run a step's output-stage work (step_tokens'), in order: its events."""
        return [event for run in work for event in run()]

    def step_tokens(self) -> Outputs:
        self.end_text_stopped()
        scheduled = self.scheduler.schedule()
        if not scheduled:
            if self.requests and not self.scheduler.has_work():  # a lost request would keep callers stepping forever
                return self._fail(set(self.requests), "the engine lost track of this request (a bug); send it again")
            return []
        try:
            samples, prompt_scores = self.runner.run(scheduled)
        except Exception as exc:  # noqa: BLE001 - a failed step fails its requests, not the engine
            return self._fail({s.request_id for s, _ in scheduled}, f"the model step failed: {exc!r}")
        for score in prompt_scores:  # before the samples: a prompt's last chunk also samples its first token
            score.seq.output.prompt.add(score.start, score.logits)
        self.scheduler.update_after_step(scheduled, {s: len(kept) - 1 for s, kept in samples if s.spec_token_ids})
        work: Outputs = []
        beam_rows: dict[str, dict[Sequence, torch.Tensor]] = {}
        for seq, kept in samples:
            if seq.params.use_beam_search and kept[0].error is None:
                beam_rows.setdefault(seq.request_id, {})[seq] = kept[0].beam_logprobs
                continue
            for sample in kept:  # a speculating sequence's accepted tokens, in order, until one ends it
                state = self.requests.get(seq.request_id)
                if state is None or seq.is_finished:
                    break
                if sample.error is not None:
                    work += self._fail({seq.request_id}, f"sampling failed: {sample.error}")
                    break
                work.append(self._append_token(seq, state, sample))
        for request_id, rows in beam_rows.items():
            if (state := self.requests.get(request_id)) is None:  # a sibling beam's row failed it
                continue
            try:
                work += self._beam_step(state, rows)
            except Exception as exc:  # noqa: BLE001 - e.g. a KV copy that fails: this search fails, not the engine
                work += self._fail({request_id}, f"beam search step failed: {exc!r}")
        return work

    def _beam_step(self, state: RequestState, rows: dict[Sequence, torch.Tensor]) -> Outputs:
        """Advance a beam search once every live beam has its log-probs row: fork the beams it keeps, or return
        its best beam as the choice when it is done."""
        live = state.live_beams
        if any(beam not in rows for beam in live):  # a beam missed this step (preempted, or out of budget)
            for beam in rows:  # the others wait for it, computing their last token again then
                self.scheduler.rewind(beam)
            return []
        step = state.beams.step(torch.stack([rows[beam] for beam in live]))
        if not step.done:
            beams, parents = state.seqs[: len(step.parents)], [live[p] for p in step.parents]
            self.runner.copy_blocks(self.scheduler.fork(beams, parents, step.tokens))
            return []
        best, choice = state.beams.best, state.seqs[0]
        self._end(choice, state)

        def text() -> list[Event]:
            try:
                events = []
                for token in best.output_ids:  # a stop string may end the text before the beam's end
                    events.append(choice.output.on_token(token))
                    if events[-1].finish_reason is not None:
                        break
            except Exception as exc:  # noqa: BLE001 - e.g. a detokenizer that breaks: this search fails alone
                return self._fail_text(state, f"beam search step failed: {exc!r}")
            events[-1].beam_score = best.score
            self._closed(state, events[-1])
            return events

        return [text]

    def _append_token(self, seq: Sequence, state: RequestState, sample: SampleResult) -> Callable[[], list[Event]]:
        self.scheduler.append_token(seq, sample.token_id)
        end = seq.output.count_token(sample.token_id, grammar_done=seq.guide is not None and seq.guide.is_terminated())
        if end.reason is not None:
            self._end(seq, state)

        def text() -> list[Event]:
            if seq.output.done:  # a stop string ended it a step ago: this token was computed past it
                return []
            try:
                event = seq.output.text(end, sample.token_id, sample.logprob, sample.top)
            except Exception as exc:  # noqa: BLE001 - e.g. a detokenizer that breaks fails its request alone
                return self._fail_text(state, f"sampling failed: {exc!r}")
            if event.finish_reason is not None and end.reason is None:  # a stop string: the engine ends it next
                self.text_stopped.append(seq)
            return [self._closed(state, event)]

        return text

    def _finish(self, seq: Sequence, state: RequestState, reason: FinishReason,
                error: str | None = None) -> Callable[[], list[Event]]:
        self._end(seq, state)
        return lambda: [] if seq.output.done else [self._closed(state, seq.output.finish(reason, error))]

    def _end(self, seq: Sequence, state: RequestState) -> None:
        """seq's choice has ended: its blocks go back, and the request leaves once all its sequences have."""
        for member in state.group(seq):
            self.scheduler.finish(member)
        if all(s.is_finished for s in state.seqs):
            self.requests.pop(seq.request_id, None)

    def end_text_stopped(self) -> None:
        """End the sequences the output stage stopped (a stop string, its own failure) since the last step: their
        blocks go back. step_tokens does it first; a caller may do it sooner."""
        while self.text_stopped:
            seq = self.text_stopped.popleft()
            state = self.requests.get(seq.request_id)
            if state is not None and not seq.is_finished:
                self._end(seq, state)

    @staticmethod
    def _closed(state: RequestState, event: Event) -> Event:
        """The request's last event, once every choice's text is out, gets usage and timings."""
        return state.close(event) if state.output.done else event

    def _fail(self, request_ids: set[str], message: str) -> Outputs:
        work = []
        for rid in request_ids:
            state = self.requests.get(rid)
            for seq in state.seqs if state else []:
                if not seq.is_finished:
                    work.append(self._finish(seq, state, "error", message))
        return work

    def _fail_text(self, state: RequestState, message: str) -> list[Event]:
        """The output stage failed on this request: every choice ends "error", and the engine ends its sequences
        at the next step."""
        events = []
        for seq in state.seqs:
            self.text_stopped.append(seq)
            if not seq.output.done:
                events.append(self._closed(state, seq.output.finish("error", message)))
        return events

    def prompt_logprob_rows(self, prompt_ids: list[int], *, after: EncodedPrompt | None = None,
                            cache_salt: str | None = None) -> torch.Tensor:
        """Teacher forcing through this engine's own prefill: fp32 log-softmax rows [len(prompt_ids) - 1, vocab],
        row p the distribution of token p + 1 given tokens 0..p (inferplug/quality.py). It steps the engine until
        the prompt is done, so the engine must be idle.

        after: a prompt as encode() gives it, which prompt_ids continue (a RAG answer after its prompt). Then the
        rows [len(prompt_ids), vocab] score the continuation's tokens only, and the prompt's KV comes from the prefix
        and document caches as a generation's would (under cache_salt): the RAG cache's fidelity
        (inferplug/benchmark/rag_fidelity.py)."""
        if self.requests:
            raise RequestError("prompt_logprob_rows steps the engine itself: finish or abort its requests first")
        ids = list(prompt_ids) if after is None else after.ids + list(prompt_ids)
        request = Request(prompt=ids, params=SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0),
                          cache_salt=cache_salt)
        if after is None:
            self.add_request(request)
        else:
            self.add_request(request, EncodedPrompt(ids, after.text, after.documents), score_from=len(after.ids) - 1)
        collector = self.requests[request.request_id].seqs[0].output.prompt
        collector.keep_rows()
        while self.requests:
            for event in self.step():
                if event.error:
                    raise GenerationError(f"scoring a {len(prompt_ids)}-token prompt failed: {event.error}")
        return collector.stacked_rows()

    def close(self) -> None:
        """Release what outlives the object: a tensor-parallel engine's worker processes."""
        self.runner.close()

    # --- metrics ----------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        return {
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting),
            "kv_blocks_used": self.blocks.num_used,
            "kv_blocks_free": self.blocks.num_free,
            "kv_blocks_total": self.blocks.num_blocks,
            "prefix_hit_rate": self.blocks.hit_rate,
            "prefix_hit_tokens": self.blocks.hit_tokens,
            "preemptions": self.scheduler.num_preemptions,
            "admitted_out_of_order": self.scheduler.order.moved if self.scheduler.order else 0,  # cache_aware.py
            **spec_stats(self.scheduler),
            **(self.doc_cache.stats() if self.doc_cache is not None else {}),
            "doc_cache_recomputed_tokens": self.scheduler.num_recomputed_tokens,  # engine/rag_recompute.py
        }
