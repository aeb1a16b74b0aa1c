"""The sampler's distributions against transformers' own logits processors, row by row.

Each row has its own logits (ties, -inf, huge and tiny values) and its own parameters. The reference
runs `transformers.generation.logits_process` in the order `generate()` builds them: processors
(RepetitionPenalty, MinNewTokensLength), then warpers (Temperature, TopK, TopP, MinP). Where we follow
vLLM v1 instead, the reference says so:
- min-p runs after temperature and before top-k/top-p (vllm/v1/sample/sampler.py: min-p is an
  argmax-invariant logits processor applied before TopKTopPSampler); transformers runs it last.
- min_tokens bans every stop id, EOS and `stop_token_ids` alike (vLLM's all_stop_token_ids);
  transformers' MinNewTokensLengthLogitsProcessor bans what it is given as EOS, so it gets both.
- presence/frequency penalties are not in transformers: OpenAI's formula over the generated tokens,
  after the repetition penalty, as vLLM's apply_penalties; written out below.
- a top-p cut inside a group of tied logits: transformers and vLLM keep whichever tied tokens their
  unstable sort puts last; we drop the lower ids (a stable sort). The distributions are then equal up
  to which members of the tie group survive, so rows are compared group by group: per group of equal
  processed logits, the number of kept tokens (exact) and their probability mass (to float rounding).
"""

from __future__ import annotations

import pytest
import torch

from inferplug.engine.sampler import processed_logits, sampling_probs
from inferplug.types import SamplingParams
from tests.engine.sampling_reference import EOS, ROWS, STOP, reference, row_logits, row_seq

def _ours(raw: torch.Tensor, p: SamplingParams, output: list[int]) -> torch.Tensor:
    return sampling_probs(processed_logits(raw, row_seq(p, output), [EOS]), p)


# float32 softmaxes of the same logits, summed in another order: a few ulps (1.2e-7 each) apart
ULPS = dict(rtol=8 * 1.2e-7, atol=1e-12)


def by_tie_group(probs: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per group of equal keys: how many tokens have a non-zero probability, and their total mass."""
    groups = torch.unique(keys, return_inverse=True)[1]
    kept = torch.zeros(int(groups.max()) + 1).index_add_(0, groups, (probs > 0).float())
    mass = torch.zeros(int(groups.max()) + 1, dtype=torch.float64).index_add_(0, groups, probs.double())
    return kept, mass


@pytest.mark.parametrize("row", range(len(ROWS)))
def test_sampled_distribution_matches_transformers(row):
    params, output = ROWS[row]
    raw = row_logits(row)
    ours, theirs = _ours(raw, params, output), reference(raw, params, output)
    keys = processed_logits(raw, row_seq(params, output), [EOS])
    (kept, mass), (hf_kept, hf_mass) = by_tie_group(ours, keys), by_tie_group(theirs, keys)
    assert torch.equal(kept, hf_kept), "a different set of sampleable tokens"
    torch.testing.assert_close(mass, hf_mass, **ULPS)


def test_min_p_before_top_p_is_vllms_order_not_transformers():
    """Row 3 with transformers' own order (min-p last) keeps more tokens: the order matters and we are vLLM's."""
    params, output = ROWS[3]
    raw = row_logits(3)
    ours, hf_order = _ours(raw, params, output), reference(raw, params, output, min_p_last=True)
    assert int((ours > 0).sum()) < int((hf_order > 0).sum())


def test_ties_are_exercised():
    """Row 0's top-k cut and row 1's top-p cut fall inside groups of tied logits: top-k keeps the whole
    group (as transformers), top-p keeps part of it, so the group comparison above has work to do."""
    raw = row_logits(0)
    assert int((raw == raw.topk(5).values[-1]).sum()) > 1 and int((_ours(raw, *ROWS[0]) > 0).sum()) > 5
    params, output = ROWS[1]
    raw = row_logits(1)
    ours, keys = _ours(raw, params, output), processed_logits(raw, row_seq(params, output), [EOS])
    assert any(0 < (ours[keys == k] > 0).sum() < (keys == k).sum() for k in keys.unique())


@pytest.mark.parametrize("params, output", [
    (SamplingParams(temperature=0.0, repetition_penalty=1.5, min_tokens=2, stop_token_ids=[STOP]), [9]),
    (SamplingParams(temperature=0.0, presence_penalty=2.0, frequency_penalty=1.0), [10, 10]),
])
def test_greedy_takes_the_argmax_of_the_processed_logits(params, output):
    for seed in range(6):
        raw = row_logits(seed)
        raw[EOS] = raw[STOP] = raw[10] = 20.0  # the penalties and the ban decide the argmax
        ours = processed_logits(raw, row_seq(params, output), [EOS])
        torch.testing.assert_close(ours, reference(raw, params, output), **ULPS)
