"""The offline LLM API's misuse errors: our error types, naming the problem and the fix."""

from __future__ import annotations

import pytest

from inferplug import LLM, SamplingParams
from inferplug.errors import ProfileError, RequestError

pytestmark = pytest.mark.smollm2


def test_an_unknown_engine_option_names_the_known_ones(smollm2_gguf):
    with pytest.raises(ProfileError, match="unknown engine option 'num_kv_block'; known: .*num_kv_blocks"):
        LLM("smollm2-135m", num_kv_block=64)  # checked before any weight is loaded


def test_sampling_params_must_be_one_or_one_per_prompt(smollm2_gguf):
    llm = LLM("smollm2-135m", num_kv_blocks=64)
    with pytest.raises(RequestError, match="got 2 sampling params for 3 prompts"):
        llm.generate(["a", "b", "c"], [SamplingParams(max_tokens=2)] * 2)
    assert len(llm.generate(["a", "b"], SamplingParams(max_tokens=2))) == 2
