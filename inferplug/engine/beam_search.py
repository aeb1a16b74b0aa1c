"""Beam search as transformers' `generate(num_beams=k, do_sample=False)` defines it (GenerationMixin._beam_search).

Each step takes the live beams' log-probability rows (log-softmax, then the min_tokens ban and repetition
penalty, as HF's processors run on log-probs), adds each beam's running sum and keeps the top
K = max(2, 1 + stop ids) * k continuations over all beams. A continuation that ends (a stop id, or
max_tokens reached) becomes a finished hypothesis if it ranks in the top k, scored
sum / generated_length ** length_penalty, the length counting the new token. The best k that do not end
run on. early_stopping: True stops once k hypotheses are finished; False stops when the best running beam,
divided by its current length ** length_penalty, cannot beat the worst of k finished ones; "never" takes
max_tokens as that length when length_penalty > 0. This class holds scores and token choices only: the
engine forks the sequences (and their KV) from what `step` returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

_NEG = -1.0e9  # HF's mask value: a continuation that ended cannot run on


@dataclass
class Hypothesis:
    score: float  # sum of log-probs / generated length ** length_penalty
    output_ids: list[int]


@dataclass
class BeamStep:
    """The continuations that run on, best first: parent (index into the rows given) and token."""

    parents: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    done: bool = False


class BeamSearch:
    def __init__(self, width: int, length_penalty: float, early_stopping: bool | str, max_tokens: int,
                 stop_ids: set[int]):
        self.width, self.length_penalty, self.early_stopping = width, length_penalty, early_stopping
        self.max_tokens, self.stop_ids = max_tokens, stop_ids
        self.keep = max(2, 1 + len(stop_ids)) * width
        self.scores = torch.zeros(1)  # running sums (float32, as HF), one per live beam; one beam at the start
        self.outputs: list[list[int]] = [[]]  # each live beam's generated tokens
        self.finished: list[Hypothesis] = []  # best first, at most width
        self.improvable = True  # HF's is_early_stop_heuristic_unsatisfied (it never turns back)

    @property
    def best(self) -> Hypothesis:
        return self.finished[0]

    def step(self, rows: torch.Tensor) -> BeamStep:
        """rows: [live beams, vocab] processed log-probs, in the order of the last step's `parents`."""
        vocab = rows.shape[-1]
        total = (rows.float() + self.scores[:, None]).reshape(-1)
        top_scores, top_ids = total.topk(min(self.keep, total.numel()))
        parents, tokens = (top_ids // vocab).tolist(), (top_ids % vocab).tolist()
        generated = len(self.outputs[0]) + 1  # every live beam has the same length
        ends = torch.tensor([t in self.stop_ids or generated >= self.max_tokens for t in tokens])
        self._add_finished(top_scores, parents, tokens, ends, generated)
        running = (top_scores + ends.float() * _NEG).topk(min(self.width, len(tokens))).indices.tolist()
        self.scores = (top_scores + ends.float() * _NEG)[running]
        self.outputs = [self.outputs[parents[j]] + [tokens[j]] for j in running]
        self._check_improvable(generated)
        full = len(self.finished) == self.width
        done = not self.improvable or (full and self.early_stopping is True) or bool(ends.all())
        return BeamStep([parents[j] for j in running], [tokens[j] for j in running], done)

    def _add_finished(self, top_scores: torch.Tensor, parents: list[int], tokens: list[int], ends: torch.Tensor,
                      generated: int) -> None:
        """The ended continuations among the top `width` join the finished ones (the best `width` stay); none
        once the search cannot improve, or is full under early_stopping=True."""
        full = len(self.finished) == self.width
        if not self.improvable or (full and self.early_stopping is True):
            return
        scores = top_scores / (generated ** self.length_penalty)
        new = [Hypothesis(float(scores[j]), self.outputs[parents[j]] + [tokens[j]])
               for j in range(min(self.width, len(tokens))) if ends[j]]
        self.finished = sorted(self.finished + new, key=lambda h: -h.score)[: self.width]

    def _check_improvable(self, generated: int) -> None:
        """HF's heuristic: can the best running beam still beat the worst of `width` finished hypotheses?"""
        if len(self.finished) < self.width:
            return
        length = generated
        if self.early_stopping == "never" and self.length_penalty > 0.0:
            length = self.max_tokens
        best_possible = float(self.scores[0] / (length ** self.length_penalty))
        self.improvable = self.improvable and best_possible > self.finished[-1].score
