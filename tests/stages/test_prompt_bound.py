"""The token-count lower bound that refuses a prompt far over the context without tokenizing it
(stages/prompt_bound.py), checked against the real tokenizers of the tiny Llama and SmolLM2."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from inferplug.errors import RequestError
from inferplug.models.loader import load_tokenizer
from inferplug.stages.prompt_bound import check_text_fits, longest_token_bytes


@pytest.fixture(scope="module", params=["tiny", "smollm2"])
def tokenizer(request, tiny_llama_dir):
    if request.param == "tiny":
        return load_tokenizer(tiny_llama_dir)
    return load_tokenizer(request.getfixturevalue("smollm2_gguf"))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(text=st.text(min_size=1, max_size=400) | st.sampled_from([" " * 300, "a" * 300, "\u4e2d" * 200]))
def test_the_bound_never_exceeds_the_real_token_count(tokenizer, text):
    real = len(tokenizer.encode(text, add_special_tokens=False))
    assert len(text.encode()) // longest_token_bytes(tokenizer) <= real
    check_text_fits(tokenizer, text, real + 1, "prompt")  # a text that fits is never refused


def test_a_prompt_megabytes_over_the_context_is_refused(tokenizer):
    with pytest.raises(RequestError, match="make at least .* tokens, but the context holds 4096") as info:
        check_text_fits(tokenizer, "lighthouse keeper " * 400_000, 4096, "prompt")
    assert info.value.param == "prompt"
