"""llama.cpp as the real-size benches drive it (bench/real_size_engines.py, bench/hybrid_chat.py): llama-cpp-python's
C API on one model file, one context, greedy."""

from __future__ import annotations

import time

from inferplug.benchmark.machine import version_of
from inferplug.benchmark.real_size_workload import Workload


class LlamaCpp:
    """llama.cpp through llama-cpp-python's C API: one context of `streams` sequences (n_ctx = context each, not
    unified), n_batch 512, greedy argmax over the logits."""

    def __init__(self, path: str, w: Workload) -> None:
        self.path, self.w = path, w

    def load(self) -> None:
        import llama_cpp as lc

        self.lc = lc
        lc.llama_backend_init()
        self.model = lc.llama_model_load_from_file(self.path.encode(), lc.llama_model_default_params())
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {self.path}")
        params = lc.llama_context_default_params()
        params.n_ctx, params.n_seq_max, params.kv_unified = self.w.context * self.w.streams, self.w.streams, False
        params.n_batch = params.n_ubatch = 512
        params.swa_full = False  # llama-server's and llama-cli's default: window layers keep their window (and a batch)
        params.n_threads = params.n_threads_batch = self.w.threads
        self.ctx = lc.llama_init_from_model(self.model, params)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create its context")
        self.n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))
        self.batch = lc.llama_batch_init(512, 0, 1)

    def decode(self, rows: list[tuple[int, int, int, bool]]) -> None:
        """rows: (token, position, sequence, wants logits), at most 512."""
        b = self.batch
        for i, (token, pos, seq, logits) in enumerate(rows):
            b.token[i], b.pos[i], b.n_seq_id[i], b.seq_id[i][0], b.logits[i] = token, pos, 1, seq, logits
        b.n_tokens = len(rows)
        if self.lc.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama_decode failed (the KV cache is full?)")

    def argmax(self, i: int) -> int:
        import numpy as np

        return int(np.ctypeslib.as_array(self.lc.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,)).argmax())

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[list[float]]:
        """Every prompt at once, each its own sequence: the time of each generated token, per stream."""
        self.lc.llama_memory_clear(self.lc.llama_get_memory(self.ctx), True)
        rows = [(t, pos, seq, pos == len(p) - 1) for seq, p in enumerate(prompts) for pos, t in enumerate(p)]
        last, stamps = [0] * len(prompts), [[] for _ in prompts]
        for start in range(0, len(rows), 512):  # prefill, 512 tokens a batch
            chunk = rows[start:start + 512]
            self.decode(chunk)
            for i, (_, _, seq, logits) in enumerate(chunk):
                if logits:
                    last[seq] = self.argmax(i)
                    stamps[seq].append(time.perf_counter())
        for step in range(max_tokens - 1):
            self.decode([(last[s], len(p) + step, s, True) for s, p in enumerate(prompts)])
            for s in range(len(prompts)):
                last[s] = self.argmax(s)
                stamps[s].append(time.perf_counter())
        return stamps

    def ttft(self, ids: list[int]) -> float:
        start = time.perf_counter()
        return self.generate([ids], 1)[0][0] - start

    def facts(self) -> dict:
        return {"version": version_of("llama_cpp_python")}
