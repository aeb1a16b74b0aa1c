"""Speculative rejection sampling keeps the target's distribution: at temperature 1, tokens drawn through the
sampler with prompt-lookup proposals (q a point mass) or a draft model's sampled proposals (its real q) follow
the tiny model's own softmax (transformers' logits), at the first row (where a proposal is accepted or replaced)
and at the second (given the first proposal was accepted). Threshold: P_FAIL = 1e-4 on Pearson's p-value."""

from __future__ import annotations

import torch

from inferplug.engine.sampler import Sampler
from inferplug.engine.sequence import Sequence
from inferplug.types import SamplingParams
from tests.engine.engine_helpers import hf_model
from tests.engine.sampling_reference import P_FAIL, chi_square_p

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



def test_draft_model_speculation_draws_follow_the_target_distribution(tiny_model_dir, tiny_draft_dir):
    """Proposals sampled from a draft model's own q (the tiny Llama's first layer, as transformers computes it)
    and checked against that q follow each target's p. The first token for every family: the Llama's p is close
    to q (mostly accepted), Qwen2's and Mistral's far from it (mostly resampled from max(0, p - q)). The second
    token given the first for the Llama, where enough first proposals are accepted."""
    target, draft = hf_model(tiny_model_dir), hf_model(tiny_draft_dir)
    prompt = torch.tensor([5, 17, 42, 99, 7, 23])
    generator = torch.Generator().manual_seed(13)
    with torch.no_grad():
        q0 = torch.softmax(draft(prompt[None]).logits[0, -1], -1)
        d1 = torch.multinomial(q0, DRAWS, replacement=True, generator=generator)
        context = torch.cat([prompt.repeat(DRAWS, 1), d1[:, None]], 1)
        q1 = torch.softmax(draft(context).logits[:, -1], -1)
        d2 = torch.multinomial(q1, 1, generator=generator)[:, 0]
        rows = target(torch.cat([context, d2[:, None]], 1)).logits[:, len(prompt) - 1:]  # [DRAWS, 3, vocab]
    params = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True)
    drafts = torch.stack([d1, d2], 1).tolist()

    seqs = [Sequence("r", i, prompt.tolist(), params, 8, generator=generator) for i in range(DRAWS)]
    qs = list(torch.stack([q0.expand(DRAWS, -1), q1], 1))  # each draw's [2, vocab] q rows
    kept, vocab = Sampler(eos_token_ids=[])(rows.reshape(-1, rows.shape[-1]), seqs, drafts, qs), rows.shape[-1]
    p0 = torch.softmax(rows[0, 0], -1)
    firsts = torch.tensor([k[0].token_id for k in kept])
    assert chi_square_p(torch.bincount(firsts, minlength=vocab), p0) > P_FAIL
    if float((p0 - q0).abs().sum()) / 2 > 0.5:  # total variation: q far from p, few first proposals accepted
        return
    top = int(torch.tensor([k[0].token_id for k in kept if len(k) > 1]).mode().values)
    seconds = torch.tensor([k[1].token_id for k in kept if len(k) > 1 and k[0].token_id == top])
    assert len(seconds) > 200, "enough accepted first proposals to test the second row"
    p1 = torch.softmax(rows[int((d1 == top).nonzero()[0]), 1], -1)  # the target's row after `top`
    assert chi_square_p(torch.bincount(seconds, minlength=vocab), p1) > P_FAIL
