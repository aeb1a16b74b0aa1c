"""Which rows of a step score prompt tokens (vLLM's SamplingParams.prompt_logprobs).

A prefill chunk's row at position p predicts prompt token p + 1, so the runner takes the logits of those rows
along with the sampled rows' (ModelRunner.layout) and the engine hands each chunk's rows to the request's output
stage (stages/prompt_logprobs.py). Such a prompt is computed, not read from the prefix cache
(Scheduler._prefix_hits), since a cached block has no logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inferplug.engine.sequence import Sequence


def wants_prompt_logprobs(seq: Sequence) -> bool:
    """seq scores its prompt: asked for, the request's first choice, and nothing generated yet (then it is done)."""
    return seq.params.prompt_logprobs is not None and seq.index == 0 and seq.num_output_tokens == 0


def scored_rows(seq: Sequence, start: int, n: int) -> int:
    """How many rows of seq's chunk [start, start + n) predict a prompt token (the last prompt row samples)."""
    if not wants_prompt_logprobs(seq):
        return 0
    return max(0, min(start + n, seq.num_prompt_tokens - 1) - start)


@dataclass
class PromptScores:
    """One chunk's scored rows: fp32 logits [count, vocab] of positions start .. start + count - 1."""

    seq: Sequence
    start: int
    logits: torch.Tensor
