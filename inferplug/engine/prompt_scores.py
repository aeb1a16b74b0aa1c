"""Which rows of a step score prompt tokens (vLLM's SamplingParams.prompt_logprobs).

A prefill chunk's row at position p predicts prompt token p + 1, so the runner takes the logits of those rows
along with the sampled rows' (ModelRunner.layout) and the engine hands each chunk's rows to the request's output
stage (stages/prompt_logprobs.py). Such a prompt is computed from its first scored row on, not read from the
prefix cache or the document cache (Scheduler._prefix_hits), since a cached block has no logits. The rows before
`Sequence.score_from` are not scored: a continuation scored after a RAG prompt (LLMEngine.prompt_logprob_rows) takes
that prompt's cached KV, as a generation would.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inferplug.engine.sequence import Sequence


def wants_prompt_logprobs(seq: Sequence) -> bool:
    """seq scores its prompt: asked for, the request's first choice, and nothing generated yet (then it is done)."""
    return seq.params.prompt_logprobs is not None and seq.index == 0 and seq.num_output_tokens == 0


def scored_rows(seq: Sequence, start: int, n: int) -> tuple[int, int]:
    """(first position, count) of the rows of seq's chunk [start, start + n) that score a prompt token: from
    seq.score_from to the last prompt row but one (that row samples)."""
    if not wants_prompt_logprobs(seq):
        return start, 0
    first = max(start, seq.score_from)
    return first, max(0, min(start + n, seq.num_prompt_tokens - 1) - first)


def cacheable_blocks(seq: Sequence, block_size: int) -> int | None:
    """How many leading blocks of seq may come from a cache (None: any): those wholly before its first scored row."""
    return seq.score_from // block_size if wants_prompt_logprobs(seq) else None


@dataclass
class PromptScores:
    """One chunk's scored rows: fp32 logits [count, vocab] of positions start .. start + count - 1."""

    seq: Sequence
    start: int
    logits: torch.Tensor
