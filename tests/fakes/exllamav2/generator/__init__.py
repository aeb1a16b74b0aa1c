"""Fake exllamav2.generator (0.3.2): the dynamic generator, its jobs and sampler settings.

Same constructor signatures, attributes (active_jobs, pending_jobs, max_pages, page_size,
referenced_pages, unreferenced_pages, num_draft_tokens) and iterate() result dicts as the real
one. Pages are accounted like the real paged cache (256 tokens, full prompt pages hashed and
shared between jobs, freed on cancel or eos); tokens come from a transformers forward pass, drawn
by _fake_sampling with the real sampler's semantics.
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from collections import deque
from copy import copy
from dataclasses import dataclass, field

import torch

from exllamav2.generator._fake_sampling import sample

PAGED_PAGE_SIZE = 256


class ExLlamaV2Sampler:
    @dataclass
    class Settings:  # every field of the real dataclass: an unknown keyword is a TypeError, as there
        token_repetition_penalty: float = 1.025
        token_repetition_range: int = -1
        token_repetition_decay: int = 0
        token_frequency_penalty: float = 0.0
        token_presence_penalty: float = 0.0
        temperature: float = 0.8
        smoothing_factor: float = 0.0
        min_temp: float = 0
        max_temp: float = 0.0
        temp_exponent: float = 1.0
        top_k: int = 50
        top_p: float = 0.8
        top_a: float = 0.0
        min_p: float = 0
        tfs: float = 0
        typical: float = 0
        skew: float = 0
        temperature_last: bool = False
        mirostat: bool = False
        mirostat_tau: float = 1.5
        mirostat_eta: float = 0.1
        mirostat_mu: float | None = None
        token_bias: torch.Tensor | None = None
        cfg_scale: float | None = None
        post_sampling_hooks: list = field(default_factory=list)
        dry_allowed_length: int = 2
        dry_base: float = 1.75
        dry_multiplier: float = 0.0
        dry_sequence_breakers: set[int] | None = None
        dry_range: int = 0
        dry_max_ngram: int = 20
        ngram_trie: dict | None = None
        ngram_index: int = 0
        ngram_history: deque = field(default_factory=deque)
        xtc_probability: float = 0.0
        xtc_threshold: float = 0.1
        xtc_ignore_tokens: frozenset[int] | None = None

        @staticmethod
        def greedy(**kwargs) -> ExLlamaV2Sampler.Settings:
            defaults = {"temperature": 1.0, "token_repetition_penalty": 1.0, "top_p": 0.0, "top_k": 1}
            defaults.update(kwargs)
            return ExLlamaV2Sampler.Settings(**defaults)

        def clone(self):
            return copy(self)


class ExLlamaV2DynamicJob:
    def __init__(self, input_ids, max_new_tokens: int, min_new_tokens: int = 0, max_skips: int | None = 4,
                 gen_settings=None, seed: int = None, stop_conditions=None, decode_special_tokens: bool = False,
                 return_top_tokens: int = 0, return_logits: bool = False, return_probs: bool = False,
                 filters=None, filter_prefer_eos: bool = False, token_healing: bool = False,
                 identifier: object | None = None, banned_strings=None, embeddings=None, **kwargs):
        assert input_ids.device.type == "cpu", "input_ids must reside in system memory"
        assert input_ids.shape[0] == 1, "input_ids must be [1, seq_len] tensor or list of [1, seq_len] tensors"
        assert input_ids.shape[-1] > 0, "Input IDs cannot be empty."
        self.input_ids = input_ids
        self.max_new_tokens = max_new_tokens
        self.min_new_tokens = min_new_tokens
        self.gen_settings = gen_settings if gen_settings is not None else ExLlamaV2Sampler.Settings()
        self.rng = random.Random() if seed is None else random.Random(seed)
        if any(not isinstance(t, (int, str)) for t in stop_conditions or []):
            raise ValueError("Unsupported type in stop_conditions")
        self.stop_tokens = {t for t in stop_conditions or [] if isinstance(t, int)}
        self.stop_strings = {t for t in stop_conditions or [] if isinstance(t, str)}
        if self.stop_strings:  # the real one holds text back while a stop string may be forming
            raise NotImplementedError("the fake has no stop strings: inferplug ends on them itself (ChoiceOutput)")
        self.decode_special_tokens = decode_special_tokens
        self.return_top_tokens = return_top_tokens
        self.return_probs = return_probs
        self.identifier = identifier
        self.generator = None
        self.serial_number = None
        self.new_tokens = 0
        self.sequence = input_ids[0].tolist()
        self.held_tokens, self.held_probs, self.held_k_tokens, self.held_k_probs = [], [], [], []
        self.held_text = ""
        self.full_completion = ""
        self.allocated_pages: list[int] = []
        self.cached_pages = 0
        self.prefilled = False
        self.time_enqueue = self.time_first_prefill = self.time_first_token = self.time_last_token = None

    def prepare_for_queue(self, generator, serial_number: int):
        self.generator = generator
        self.serial_number = serial_number
        total_pages = -(-(len(self.input_ids[0]) + self.max_new_tokens) // generator.page_size)
        assert total_pages <= generator.max_pages, \
            f"Job requires {total_pages} pages (only {generator.max_pages} available) and cannot " + \
            f"be enqueued. Total cache allocated is {generator.max_pages} * {generator.page_size} = " + \
            f"{generator.max_total_tokens} tokens"

    def _base(self, stage: str, eos: bool = False) -> dict:
        r = {"job": self, "stage": stage, "eos": eos, "serial": self.serial_number}
        if self.identifier is not None:
            r["identifier"] = self.identifier
        return r

    def _sample(self, logits: torch.Tensor) -> tuple[int, float, list[int], list[float]]:
        if self.new_tokens < self.min_new_tokens:
            for t in self.stop_tokens:
                logits[t] = -math.inf
        probs = sample(logits, self.gen_settings, self.sequence)
        token = int(torch.searchsorted(probs.cumsum(0), torch.tensor(self.rng.random())).clamp(max=len(probs) - 1))
        top = probs.topk(self.return_top_tokens) if self.return_top_tokens else None
        return (token, float(probs[token]), top.indices.tolist() if top else [],
                top.values.tolist() if top else [])

    def _emit(self, results: list, eos: bool = False, eos_reason: str | None = None, emit_held: bool = False,
              stop_token: int | None = None):
        r = self._base("streaming", eos)
        if eos_reason is not None:
            r["eos_reason"] = eos_reason
            if eos_reason == "stop_token":
                r["eos_triggering_token_id"] = stop_token
                r["eos_triggering_token_str"] = self.generator.tokenizer.get_id_to_piece_list(True)[stop_token]
        held = self._held_dict()
        if emit_held:
            r.update(held)
            self.full_completion += self.held_text
            self.held_text, self.held_tokens, self.held_probs = "", [], []
            self.held_k_tokens, self.held_k_probs = [], []
        if eos:
            self.time_last_token = time.time()
            r.update({"full_completion": self.full_completion, "new_tokens": self.new_tokens,
                      "prompt_tokens": len(self.input_ids[0]),
                      "time_enqueued": self.time_first_prefill - self.time_enqueue,
                      "time_prefill": self.time_first_token - self.time_first_prefill,
                      "time_generate": self.time_last_token - self.time_first_token,
                      "cached_pages": self.cached_pages,
                      "cached_tokens": self.cached_pages * self.generator.page_size})
            if not emit_held and held:
                r["held"] = held
        results.append(r)

    def _held_dict(self) -> dict:
        held = {}
        if self.held_text:
            held["text"] = self.held_text
        if self.held_tokens:
            held["token_ids"] = torch.tensor([self.held_tokens], dtype=torch.long)
        if self.held_probs:
            held["token_probs"] = torch.tensor([self.held_probs])
        if self.held_k_tokens:
            held["top_k_tokens"] = torch.tensor([self.held_k_tokens], dtype=torch.long)
            held["top_k_probs"] = torch.tensor([self.held_k_probs])
        return held

    def _step(self, results: list) -> bool:
        """Prefill (first call) or one generated token; True when the job ended."""
        if not self.prefilled:
            self.prefilled = True
            self.time_first_prefill = time.time()
            r = self._base("prefill")
            r.update(curr_progress=len(self.sequence) - 1, max_progress=len(self.sequence) - 1)
            results.append(r)
        with torch.no_grad():
            logits = self.generator.model.hf_model(torch.tensor([self.sequence])).logits[0, -1].float()
        token, prob, k_tokens, k_probs = self._sample(logits)
        self.time_first_token = self.time_first_token or time.time()
        self.new_tokens += 1
        self.sequence.append(token)
        pieces = self.generator.tokenizer.get_id_to_piece_list(self.decode_special_tokens)
        self.held_text += pieces[token]
        self.held_tokens.append(token)
        if self.return_probs:
            self.held_probs.append(prob)
        if self.return_top_tokens > 0:
            self.held_k_tokens.append(k_tokens)
            self.held_k_probs.append(k_probs)
        if token in self.stop_tokens:
            self._emit(results, eos=True, eos_reason="stop_token", stop_token=token)
            return True
        if self.new_tokens >= self.max_new_tokens - self.generator.num_draft_tokens:
            self._emit(results, eos=True, eos_reason="max_new_tokens", emit_held=True)
            return True
        if 1 <= self.held_text.count("\ufffd") < 5:  # hold an incomplete character, as the real one does
            decoded = self.generator.tokenizer.decode(torch.tensor([self.held_tokens]))[0]
            if "\ufffd" in decoded:
                self._emit(results)
                return False
            self.held_text = decoded
        self._emit(results, emit_held=True)
        return False


class ExLlamaV2DynamicGenerator:
    def __init__(self, model, cache, tokenizer, max_batch_size: int = None, max_seq_len: int | None = None,
                 max_chunk_size: int | None = None, max_q_size: int = 8, draft_model=None, draft_cache=None,
                 num_draft_tokens: int = 4, use_ngram_draft: bool = False, max_ngram: int = 4,
                 max_sampling_threads: int = 16, min_sampling_threads: int = 3, paged: bool = True,
                 filter_background_eval: bool = True, **kwargs):
        assert model.loaded, "the model must be loaded"
        assert cache.batch_size == 1, f"DynamicGenerator requires cache to have batch_size = 1"
        assert cache.max_seq_len % PAGED_PAGE_SIZE == 0, \
            f"cache.max_seq_len must be multiple of {PAGED_PAGE_SIZE}, received {cache.max_seq_len}"
        self.model, self.cache, self.tokenizer = model, cache, tokenizer
        self.max_batch_size = max_batch_size or model.config.max_input_len // max_q_size
        if max_seq_len is not None:
            assert max_seq_len <= model.config.max_seq_len
        self.max_seq_len = max_seq_len or model.config.max_seq_len
        self.draft_model, self.draft_cache = draft_model, draft_cache
        self.num_draft_tokens = num_draft_tokens if (draft_model or use_ngram_draft) else 0
        self.use_ngram_draft = use_ngram_draft
        self.paged = paged
        self.page_size = PAGED_PAGE_SIZE if paged else cache.max_seq_len
        self.max_pages = max(cache.max_seq_len // self.page_size, 1)
        self.max_total_tokens = cache.max_seq_len
        self.pending_jobs: list[ExLlamaV2DynamicJob] = []
        self.active_jobs: list[ExLlamaV2DynamicJob] = []
        self.job_serial = 0
        self.referenced_pages: dict[int, int] = {}  # page -> ref count
        self.unreferenced_pages: dict[int, bytes | None] = {i: None for i in range(self.max_pages)}  # LRU order
        self.page_hash: dict[int, bytes] = {}
        self.hash_page: dict[bytes, int] = {}

    def num_remaining_jobs(self):
        return len(self.pending_jobs) + len(self.active_jobs)

    def enqueue(self, job):
        if isinstance(job, list):
            return [self.enqueue(j) for j in job]
        job.prepare_for_queue(self, self.job_serial)
        self.job_serial += 1
        self.pending_jobs.append(job)
        job.time_enqueue = time.time()
        return job.serial_number

    def cancel(self, job):
        self.num_remaining_jobs()  # as the real one, which defragments the cache once no job is left
        if job in self.pending_jobs:
            self.pending_jobs.remove(job)
        elif job in self.active_jobs:
            self._deallocate(job)
            self.active_jobs.remove(job)

    def iterate(self) -> list[dict]:
        results: list[dict] = []
        while (self.pending_jobs and len(self.active_jobs) < self.max_batch_size
               and self._allocate(self.pending_jobs[0])):
            job = self.pending_jobs.pop(0)
            self.active_jobs.append(job)
            results.append(job._base("started"))
        for job in list(self.active_jobs):
            if job._step(results):
                self._deallocate(job)
                self.active_jobs.remove(job)
        return results

    # --- paged cache accounting ----------------------------------------------------
    def _prompt_page_hashes(self, job) -> list[bytes]:
        ids, hashes, parent = job.input_ids[0].tolist(), [], b""
        for start in range(0, len(ids) - 1 - self.page_size + 1, self.page_size):  # full pages before the last token
            parent = hashlib.sha256(parent + str(ids[start:start + self.page_size]).encode()).digest()
            hashes.append(parent)
        return hashes

    def _allocate(self, job) -> bool:
        need = -(-(len(job.input_ids[0]) + job.max_new_tokens) // self.page_size)
        hashes = self._prompt_page_hashes(job) if self.paged else []
        shared = [self.hash_page[h] for h in hashes if h in self.hash_page]
        if need - len(shared) > len([p for p in self.unreferenced_pages if p not in shared]):
            return False
        pages = []
        for h in hashes:
            page = self.hash_page.get(h)
            if page is None:
                page = self._take_page()
                self.page_hash[page], self.hash_page[h] = h, page
            else:
                job.cached_pages += 1
                self.unreferenced_pages.pop(page, None)
            pages.append(page)
        pages += [self._take_page() for _ in range(need - len(pages))]
        for page in pages:
            self.referenced_pages[page] = self.referenced_pages.get(page, 0) + 1
        job.allocated_pages = pages
        return True

    def _take_page(self) -> int:
        page = next(iter(self.unreferenced_pages))  # least recently used
        del self.unreferenced_pages[page]
        old = self.page_hash.pop(page, None)
        if old is not None:
            self.hash_page.pop(old, None)
        return page

    def _deallocate(self, job):
        for page in reversed(job.allocated_pages):
            self.referenced_pages[page] -= 1
            if self.referenced_pages[page] == 0:
                del self.referenced_pages[page]
                self.unreferenced_pages[page] = self.page_hash.get(page)
        job.allocated_pages = []
