"""How the field judges reused document KV (issue 43; docs/rag_cache.md, "How a policy is judged").

Gate 2, distribution fidelity: the full recompute's greedy answer is teacher-forced under the full KV and under
the reused KV (LLMEngine.prompt_logprob_rows with `after`), and on those answer tokens we take KL(full || reuse)
per token (mean and p95), top-1 agreement and the answer's log-prob difference, as llama.cpp's
`perplexity --kl-divergence` compares two paths (inferplug/quality.py).
Gate 3, task quality: token F1 of each greedy answer against the gold one (SQuAD's normalisation, as CacheBlend
scores), paired per query (reuse minus full), with a bootstrap 95% confidence interval of the mean.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from dataclasses import dataclass

import torch

from inferplug.quality import kl_divergence

_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> list[str]:
    """SQuAD's: lower case, no punctuation, no articles, words split on white space."""
    text = "".join(c for c in text.lower() if c not in set(string.punctuation))
    return _ARTICLES.sub(" ", text).split()


def f1_score(prediction: str, gold: str) -> float:
    pred, ref = normalize_answer(prediction), normalize_answer(gold)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def bootstrap_mean(values: list[float], samples: int = 10_000, seed: int = 0,
                   level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the mean and its percentile bootstrap interval (queries resampled with replacement)."""
    x = torch.tensor(values, dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    means = x[torch.randint(len(x), (samples, len(x)), generator=gen)].mean(dim=1)
    tail = (1 - level) / 2
    low, high = torch.quantile(means, torch.tensor([tail, 1 - tail], dtype=torch.float64)).tolist()
    return x.mean().item(), low, high


@dataclass
class AnswerFidelity:
    """One query's answer tokens teacher-forced under two KVs: per-token KL(full || test) and top-1 agreement,
    and the answer's summed log-prob under each."""

    kld: torch.Tensor
    agree: torch.Tensor
    logprob_full: float
    logprob_test: float


def answer_fidelity(full_rows: torch.Tensor, test_rows: torch.Tensor, answer_ids: list[int]) -> AnswerFidelity:
    """full_rows, test_rows: log-softmax rows [len(answer_ids), vocab], row i the distribution of answer token i."""
    target = torch.tensor(answer_ids)[:, None]
    return AnswerFidelity(kld=kl_divergence(full_rows, test_rows),
                          agree=full_rows.argmax(dim=-1) == test_rows.argmax(dim=-1),
                          logprob_full=full_rows.gather(1, target).sum().item(),
                          logprob_test=test_rows.gather(1, target).sum().item())


def fidelity_summary(per_query: list[AnswerFidelity]) -> dict[str, float]:
    """Gate 2's figures over every answer token of every query."""
    kld = torch.cat([q.kld for q in per_query])
    return {"mean_kld": kld.mean().item(), "p95_kld": torch.quantile(kld, 0.95).item(),
            "top1_agree": torch.cat([q.agree for q in per_query]).double().mean().item(),
            "mean_answer_logprob_diff": sum(q.logprob_test - q.logprob_full for q in per_query) / len(per_query),
            "answer_tokens": len(kld)}


def quality_summary(f1_test: list[float], f1_full: list[float]) -> dict[str, float]:
    """Gate 3's figures: mean F1 of each side and the paired difference with its bootstrap 95% interval."""
    diff, low, high = bootstrap_mean([t - f for t, f in zip(f1_test, f1_full)])
    return {"f1": sum(f1_test) / len(f1_test), "f1_full": sum(f1_full) / len(f1_full), "f1_diff": diff,
            "f1_diff_low": low, "f1_diff_high": high}


F1_BAR = -0.02  # gate 3: CacheBlend's bar on the mean paired F1 difference (reuse minus full)
KL_BOUND_FACTOR = 5.0  # gate 2: a policy's mean KL may be this many times the noise floor (docs/rag_cache.md)
