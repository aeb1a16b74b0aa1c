"""How much a compute path changes the model's predictions, measured as llama.cpp measures quantization.

llama.cpp's `perplexity --kl-divergence`: the text is cut into chunks of 512 tokens, each chunk is run fresh
(teacher-forced, no KV carried over), its first half is context only, and at each position of its second half
the path's next-token distribution is compared with the fp32 reference's: the KL divergence KL(ref || path),
whether the two argmaxes agree (top-1 agreement), and the perplexity of each on the text's own tokens.
The product rule (docs/profiles.md, "Quality"): a path may be a default only if its mean KLD is no larger than
that of Q8_0 weights with fp32 activations.

Every path runs through the engine's own prefill (LLMEngine.prompt_logprob_rows: the native model over paged
KV, chunked as the engine's step budget says). The shipped text: inferplug/data/quality/ (its README says where
it comes from).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from importlib.resources import files
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from inferplug.engine.llm_engine import LLMEngine

CHUNK = 512  # llama.cpp's default context for the KLD measurement
TEXT_FILE = "data/quality/esther_kjv.txt"


def quality_text() -> str:
    """The shipped public-domain text the measurement scores (over 4,000 SmolLM2 tokens)."""
    return files("inferplug").joinpath(TEXT_FILE).read_text(encoding="utf-8")


def chunks(token_ids: list[int], size: int = CHUNK, limit: int | None = None) -> list[list[int]]:
    """The text's whole chunks of `size` tokens (a short tail is dropped, as llama.cpp does), at most `limit`."""
    count = len(token_ids) // size if limit is None else min(limit, len(token_ids) // size)
    if count == 0:
        raise ValueError(f"the text has {len(token_ids)} tokens, fewer than one chunk of {size}; use a longer text")
    return [token_ids[i * size:(i + 1) * size] for i in range(count)]


def scored_logprobs(engine: LLMEngine, chunk: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk's second half: the log-softmax rows [positions, vocab] and the tokens they predict."""
    first = len(chunk) // 2  # row p predicts token p + 1: rows first .. len - 2, as llama.cpp scores them
    rows = engine.prompt_logprob_rows(chunk)
    return rows[first:].clone(), torch.tensor(chunk[first + 1:])  # a copy: the first half is freed


def text_logprobs(engine: LLMEngine, chunk_list: list[list[int]]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for chunk in chunk_list:
        yield scored_logprobs(engine, chunk)


@dataclass
class PositionStats:
    """Per scored position: KL(ref || test), argmax agreement, and each distribution's NLL of the true token."""

    kld: torch.Tensor
    agree: torch.Tensor
    nll_ref: torch.Tensor
    nll_test: torch.Tensor

    @classmethod
    def cat(cls, parts: list[PositionStats]) -> PositionStats:
        return cls(*(torch.cat([getattr(p, name) for p in parts]) for name in ("kld", "agree", "nll_ref", "nll_test")))


def kl_divergence(ref_logprobs: torch.Tensor, test_logprobs: torch.Tensor) -> torch.Tensor:
    """KL(ref || test) of each row, in nats: sum p_ref * (log p_ref - log p_test). Rows are log-softmax outputs."""
    ref, test = ref_logprobs.double(), test_logprobs.double()
    return (ref.exp() * (ref - test)).sum(dim=-1).clamp(min=0.0)  # rounding can leave a tiny negative


def compare_rows(ref_logprobs: torch.Tensor, test_logprobs: torch.Tensor, targets: torch.Tensor) -> PositionStats:
    return PositionStats(
        kld=kl_divergence(ref_logprobs, test_logprobs),
        agree=ref_logprobs.argmax(dim=-1) == test_logprobs.argmax(dim=-1),
        nll_ref=-ref_logprobs.double().gather(1, targets[:, None])[:, 0],
        nll_test=-test_logprobs.double().gather(1, targets[:, None])[:, 0],
    )


@dataclass
class Quality:
    """A path against the reference over the scored positions; each `_se` is a standard error of the mean."""

    positions: int
    mean_kld: float
    kld_se: float
    kld_p99: float
    kld_max: float
    top1: float  # % of positions whose argmax agrees with the reference's
    top1_se: float
    ppl_ref: float
    ppl: float
    ppl_se: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(stats: PositionStats) -> Quality:
    n = stats.kld.numel()
    kld, agree = stats.kld, stats.agree.double()
    nll_mean = float(stats.nll_test.mean())
    nll_se = _se(stats.nll_test)
    top1 = float(agree.mean())
    return Quality(
        positions=n, mean_kld=float(kld.mean()), kld_se=_se(kld), kld_p99=float(torch.quantile(kld, 0.99)),
        kld_max=float(kld.max()), top1=100.0 * top1, top1_se=100.0 * math.sqrt(top1 * (1 - top1) / max(n - 1, 1)),
        ppl_ref=math.exp(float(stats.nll_ref.mean())), ppl=math.exp(nll_mean),
        ppl_se=math.exp(nll_mean) * nll_se,  # d exp(x) = exp(x) dx
    )


def _se(values: torch.Tensor) -> float:
    n = values.numel()
    return float(values.std(correction=1) / math.sqrt(n)) if n > 1 else 0.0


def compare(reference: list[tuple[torch.Tensor, torch.Tensor]],
            test: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> Quality:
    """A path's scored rows against the reference's, chunk by chunk (both from text_logprobs on the same chunks)."""
    return summarize(PositionStats.cat([compare_rows(ref, rows, targets)
                                        for (ref, targets), (rows, _) in zip(reference, test, strict=True)]))


def measure(engine: LLMEngine, chunk_list: list[list[int]],
            reference: list[tuple[torch.Tensor, torch.Tensor]]) -> Quality:
    """The engine's path against the reference's scored rows (text_logprobs of the fp32 engine, same chunks)."""
    return compare(reference, text_logprobs(engine, chunk_list))
