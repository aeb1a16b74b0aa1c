"""Speculative rejection sampling keeps the target's distribution: at temperature 1, tokens drawn through the
sampler with prompt-lookup proposals follow the tiny model's own softmax (transformers' logits), at the first
row (where a proposal is accepted or replaced) and at the second (given the first proposal was accepted)."""

from __future__ import annotations

import torch
from engine_helpers import hf_model
from test_sampler_statistics import P_FAIL, chi_square_p

from inferplug.engine.sampler import Sampler
from inferplug.engine.sequence import Sequence
from inferplug.types import SamplingParams

DRAWS = 12_000


def test_sampled_speculation_draws_follow_the_target_distribution(tiny_llama_dir):
    model = hf_model(tiny_llama_dir)
    prompt = [5, 17, 42, 99, 7, 23]
    with torch.no_grad():
        first = model(torch.tensor([prompt])).logits[0, -1]
    # proposals: the first row's likeliest token (often accepted), then an unlikely one (mostly replaced)
    drafts = [int(first.argmax()), int(first.argmin())]
    with torch.no_grad():
        rows = model(torch.tensor([prompt + drafts])).logits[0, len(prompt) - 1:]  # 3 rows: 2 checks + 1 past
    params = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True)
    generator = torch.Generator().manual_seed(11)
    seqs = [Sequence("r", i, list(prompt), params, 8, generator=generator) for i in range(DRAWS)]
    kept = Sampler(eos_token_ids=[])(rows.repeat(DRAWS, 1), seqs, [drafts] * DRAWS)
    vocab = rows.shape[1]

    firsts = torch.tensor([k[0].token_id for k in kept])
    assert chi_square_p(torch.bincount(firsts, minlength=vocab), torch.softmax(rows[0], -1)) > P_FAIL
    seconds = torch.tensor([k[1].token_id for k in kept if k[0].token_id == drafts[0]])
    assert len(seconds) > 200, "enough accepted first proposals to test the second row"
    assert chi_square_p(torch.bincount(seconds, minlength=vocab), torch.softmax(rows[1], -1)) > P_FAIL
    assert all(len(k) <= 3 and [r.token_id for r in k[:-1]] == drafts[: len(k) - 1] for k in kept)
