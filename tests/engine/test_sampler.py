"""The sampler fails a row alone: NaN logits or a guide that rejects the token mark that row, not the batch."""

from __future__ import annotations

import pytest
import torch

from inferplug.engine.sampler import Sampler
from inferplug.engine.sequence import Sequence
from inferplug.types import SamplingParams


def _seq(params: SamplingParams, **kw) -> Sequence:
    return Sequence("r", 0, [3, 4, 5], params, max_tokens=8, **kw)


def test_a_row_with_nan_logits_fails_alone():
    logits = torch.randn(2, 32)
    logits[1] = float("nan")  # e.g. an fp16 overflow in that row only
    ok = _seq(SamplingParams(temperature=0.0, logprobs=2))  # not plain greedy: goes through the per-row path
    bad = _seq(SamplingParams(temperature=1.0, seed=7), generator=torch.Generator().manual_seed(7))
    (first,), (second,) = Sampler(eos_token_ids=[0])(logits, [ok, bad])
    assert first.error is None and first.token_id == int(logits[0].argmax()) and len(first.top) == 2
    assert second.token_id == -1 and "probability" in second.error


def test_a_guide_rejecting_the_token_fails_the_row(tiny_llama_dir):
    from transformers import AutoTokenizer

    from inferplug.engine.guided import make_guide

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    guide = make_guide(tokenizer, {"type": "object"})
    logits = torch.full((1, len(tokenizer)), float("-inf"))  # nothing sampleable: argmax falls on token 0
    ((result,),) = Sampler(eos_token_ids=[])(logits, [_seq(SamplingParams(temperature=0.0), guide=guide)])
    assert result.token_id == -1 and "rejected token 0" in result.error


DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU")])]


@pytest.mark.parametrize("device", DEVICES)
def test_seeded_penalised_rows_sample_on_the_logits_device(device, tiny_llama_dir):
    from inferplug.engine.request_state import RequestState
    from inferplug.models.loader import load_tokenizer
    from inferplug.types import Request

    params = SamplingParams(temperature=1.0, seed=5, n=2, repetition_penalty=1.3, presence_penalty=0.5,
                            frequency_penalty=0.5)
    request = Request(prompt=[3, 4, 5], params=params, request_id="r")
    logits = torch.randn(2, 64, device=device)
    draws = []
    for _ in range(2):  # same seeds, same draws
        seqs = RequestState.create(request, [3, 4, 5], 64, load_tokenizer(tiny_llama_dir), device).seqs
        for seq in seqs:
            seq.token_ids += [7, 7, 9]  # output tokens, so presence/frequency penalties apply
        results = [r for (r,) in Sampler(eos_token_ids=[0])(logits, seqs)]
        assert [r.error for r in results] == [None, None]
        draws.append([r.token_id for r in results])
    assert draws[0] == draws[1]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_tiny_repetition_penalty_keeps_the_logits_finite(temperature):
    """A valid (positive) but tiny penalty divides a seen token's positive logit past float32's range: it stays the
    largest float, so the row samples a seen token instead of failing on inf and NaN (the fuzzer's
    repetition_penalty=5.6e-258 failed the request)."""
    logits = torch.randn(1, 32)
    logits[0, 4] = 2.0  # a seen (prompt) token with a positive logit
    params = SamplingParams(temperature=temperature, seed=3, repetition_penalty=5.568074533987348e-258)
    seq = _seq(params, generator=torch.Generator().manual_seed(3))
    ((result,),) = Sampler(eos_token_ids=[0])(logits, [seq])
    assert result.error is None and result.token_id in (3, 4, 5)
