"""Completions' echo with logprobs, as lm-evaluation-harness scores a continuation (echo, logprobs, max_tokens 0),
and vLLM's prompt_logprobs, through the official openai client on the native engine: the prompt tokens' logprobs
are HF transformers' on the same tiny model."""

from __future__ import annotations

import openai
import pytest
import torch

from tests.engine.engine_helpers import hf_model


def hf_logprobs(tiny_llama_dir, prompt: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(hf_model(tiny_llama_dir)(torch.tensor([prompt])).logits[0].float(), dim=-1)


def test_echo_with_max_tokens_0_scores_the_prompt_alone(native_client, native, tiny_llama_dir):
    prompt = native.tokenizer.encode("the cat sat on the mat")
    done = native_client.completions.create(model="tiny", prompt=prompt, echo=True, logprobs=2, max_tokens=0,
                                            temperature=0)
    choice, reference = done.choices[0], hf_logprobs(tiny_llama_dir, prompt)
    assert choice.text == native.tokenizer.decode(prompt) and choice.finish_reason == "length"
    lp = choice.logprobs
    assert lp.tokens == [native.tokenizer.decode([t]) for t in prompt]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    expected = [float(reference[p, prompt[p + 1]]) for p in range(len(prompt) - 1)]
    assert lp.token_logprobs[1:] == pytest.approx(expected, abs=1e-4)
    for p, top in enumerate(lp.top_logprobs[1:]):
        values, ids = reference[p].topk(2)
        assert list(top.values()) == pytest.approx(values.tolist(), abs=1e-4)
        assert list(top) == [native.tokenizer.decode([i]) for i in ids.tolist()]
    assert lp.text_offset[:2] == [0, len(lp.tokens[0])]
    assert done.usage.completion_tokens == 0 and done.usage.prompt_tokens == len(prompt)


def test_echo_puts_the_prompt_before_the_completion(native_client):
    kw = dict(model="tiny", prompt="the weather is", temperature=0, max_tokens=4, extra_body={"ignore_eos": True})
    plain = native_client.completions.create(**kw, logprobs=1)
    echoed = native_client.completions.create(**kw, logprobs=1, echo=True)
    assert echoed.choices[0].text == "the weather is" + plain.choices[0].text
    prompt_tokens = echoed.usage.prompt_tokens
    assert echoed.choices[0].logprobs.tokens[prompt_tokens:] == plain.choices[0].logprobs.tokens
    assert echoed.choices[0].logprobs.token_logprobs[prompt_tokens:] == pytest.approx(
        plain.choices[0].logprobs.token_logprobs, abs=1e-5)
    streamed = native_client.completions.create(**kw, echo=True, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == echoed.choices[0].text


def test_vllm_prompt_logprobs_field(native_client, native, tiny_llama_dir):
    prompt = native.tokenizer.encode("one two three")
    done = native_client.completions.create(model="tiny", prompt=prompt, max_tokens=1, temperature=0,
                                            extra_body={"prompt_logprobs": 1})
    entries = done.choices[0].model_extra["prompt_logprobs"]
    reference = hf_logprobs(tiny_llama_dir, prompt)
    assert entries[0] is None and len(entries) == len(prompt)
    for p, entry in enumerate(entries[1:]):
        assert entry[str(prompt[p + 1])]["logprob"] == pytest.approx(float(reference[p, prompt[p + 1]]), abs=1e-4)


def test_max_tokens_0_without_echo_is_a_400(native_client):
    with pytest.raises(openai.BadRequestError, match="max_tokens=0"):
        native_client.completions.create(model="tiny", prompt="hello", max_tokens=0)


def test_a_backend_that_cannot_score_prompts_answers_400(live_server):
    with pytest.raises(openai.BadRequestError, match="prompt_logprobs"):  # CTranslate2: no prompt logits
        live_server.client().completions.create(model="tiny-llama", prompt="hello", echo=True, logprobs=1,
                                                max_tokens=0)
