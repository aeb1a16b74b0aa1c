"""logit_bias on the engine's other decoding paths: speculative decoding (a draft model, prompt lookup) gives the
tokens plain greedy decoding gives under the same bias, as its verification keeps the target's choice; beam search
never takes a banned token. (The plain path is held against HF transformers in tests/server/test_logit_bias.py.)"""

from __future__ import annotations

import pytest

from inferplug.types import Request, SamplingParams
from tests.engine.engine_helpers import make_engine, prompts_of, run_all, tokens_of


def generate(engine, params: SamplingParams, prompt: list[int]) -> list[int]:
    return tokens_of(run_all(engine, [Request(prompt=prompt, params=params, request_id="r")])["r"])


@pytest.mark.parametrize("method", ["draft", "ngram"])
def test_speculation_keeps_the_biased_greedy_tokens(tiny_llama_dir, tiny_draft_dir, method):
    from inferplug.backends.native import load_draft
    from inferplug.engine.config import EngineConfig
    from inferplug.profile import ModelSource

    prompt = prompts_of([9])[0] * 3  # repeats, so prompt lookup proposes
    plain = make_engine(tiny_llama_dir)
    unbiased = generate(plain, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), prompt)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logit_bias={unbiased[0]: -100.0, 17: 0.5})
    expected = generate(plain, params, prompt)
    spec = (dict(draft=load_draft(ModelSource(path=tiny_draft_dir), EngineConfig()), speculative_method="draft")
            if method == "draft" else dict(speculative_method="ngram", ngram_min=1, ngram_max=3))
    engine = make_engine(tiny_llama_dir, num_speculative_tokens=3, **spec)
    assert generate(engine, params, prompt) == expected and unbiased[0] not in expected
    assert engine.stats()["spec_draft_tokens"] > 0


def test_beam_search_never_takes_a_banned_token(tiny_llama_dir):
    prompt, engine = prompts_of([9])[0], make_engine(tiny_llama_dir)
    beam = dict(use_beam_search=True, beam_width=3, max_tokens=8, ignore_eos=True)
    best = generate(engine, SamplingParams(**beam), prompt)
    banned = generate(engine, SamplingParams(**beam, logit_bias={t: -100.0 for t in best}), prompt)
    assert len(banned) == 8 and not set(best) & set(banned)
