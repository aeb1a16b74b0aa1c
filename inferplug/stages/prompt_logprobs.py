"""Prompt logprobs (vLLM's SamplingParams.prompt_logprobs): each prompt token's log-prob given its prefix.

The engine hands each prefill chunk's scored rows here (engine/prompt_scores.py picks them). The request's
first choice collects them by position (a preempted prompt computes its rows again and overwrites them) and puts
them on its first event.
"""

from __future__ import annotations

from typing import Any

import torch

from inferplug.types import TokenLogprob


class PromptLogprobs:
    """A request's prompt logprobs, filled chunk by chunk."""

    def __init__(self, prompt_ids: list[int], top: int):
        self.prompt_ids, self.top = prompt_ids, top
        self.chosen: dict[int, float] = {}  # position p -> logprob of prompt token p + 1
        self.alternatives: dict[int, list[tuple[int, float]]] = {}
        self.rows: dict[int, torch.Tensor] | None = None  # position -> [vocab] log-softmax, once keep_rows()

    def keep_rows(self) -> None:
        """Keep every row's whole log-softmax too (LLMEngine.prompt_logprob_rows: the quality measurement)."""
        self.rows = {}

    def add(self, start: int, logits: torch.Tensor) -> None:
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        targets = torch.tensor(self.prompt_ids[start + 1:start + 1 + len(logprobs)], device=logprobs.device)
        chosen = logprobs.gather(1, targets[:, None])[:, 0].tolist()
        values, ids = logprobs.topk(self.top, dim=-1) if self.top else (logprobs[:, :0], logprobs[:, :0].long())
        for i, (lp, tops, top_ids) in enumerate(zip(chosen, values.tolist(), ids.tolist())):
            self.chosen[start + i] = lp
            self.alternatives[start + i] = list(zip(top_ids, tops))
            if self.rows is not None:
                self.rows[start + i] = logprobs[i]

    def entries(self, tokenizer: Any) -> list[TokenLogprob | None]:
        """vLLM's shape: None for the first prompt token, then each token's logprob and the top alternatives (None
        for a token before the first scored row: Sequence.score_from)."""
        text = tokenizer.decode
        return [None] + [
            TokenLogprob(token, text([token]), self.chosen[p], [(t, text([t]), lp) for t, lp in self.alternatives[p]])
            if p in self.chosen else None
            for p, token in enumerate(self.prompt_ids[1:])
        ]

    def stacked_rows(self) -> torch.Tensor:
        """Every kept row in position order: [len(prompt) - 1, vocab]."""
        return torch.stack([self.rows[p] for p in sorted(self.rows)])
