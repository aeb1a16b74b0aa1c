"""OpenAI's logit_bias through the official openai client on the native engine: greedy tokens are HF transformers'
argmax of the same tiny model's logits plus the bias, step by step; a bad bias, and vLLM's guided decoding fields
(which this server does not run), get a 400 naming the field, and the server keeps serving."""

from __future__ import annotations

import openai
import pytest
import torch

from tests.engine.engine_helpers import hf_model


def hf_greedy(tiny_llama_dir, prompt: list[int], bias: dict[int, float], steps: int) -> list[int]:
    model, ids = hf_model(tiny_llama_dir), list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            logits[list(bias)] += torch.tensor(list(bias.values()))
            ids.append(int(logits.argmax()))
    return ids[len(prompt):]


def test_a_banned_token_is_never_chosen_and_the_rest_follow_hf(native_client, native, tiny_llama_dir):
    prompt = native.tokenizer.encode("the cat sat on the mat")
    plain = hf_greedy(tiny_llama_dir, prompt, {}, 6)
    bias = {plain[0]: -100.0, plain[1]: -100.0}
    expected = hf_greedy(tiny_llama_dir, prompt, bias, 6)
    assert expected != plain and not set(bias) & set(expected)
    greedy = dict(model="tiny", prompt=prompt, temperature=0, max_tokens=6, extra_body={"ignore_eos": True})
    biased = native_client.completions.create(**greedy, logit_bias={str(t): b for t, b in bias.items()})
    assert biased.choices[0].text == native.tokenizer.decode(expected)
    unbiased = native_client.completions.create(**greedy)
    assert unbiased.choices[0].text == native.tokenizer.decode(plain)


def test_a_large_bias_forces_its_token_in_sampling_too(native_client, native):
    prompt = native.tokenizer.encode("the weather is")
    token = native.tokenizer.encode(" cat", add_special_tokens=False)[-1]
    reply = native_client.completions.create(model="tiny", prompt=prompt, temperature=1.0, seed=3, max_tokens=5,
                                             logit_bias={str(token): 100}, extra_body={"ignore_eos": True})
    assert reply.choices[0].text == native.tokenizer.decode([token] * 5)


@pytest.mark.parametrize("kw, param", [
    (dict(logit_bias={"cat": 5}), "logit_bias"),
    (dict(logit_bias={"\u00b2": 5}), "logit_bias"),  # "²": a digit to str.isdigit, not a token id
    (dict(logit_bias={str(t): 1 for t in range(1025)}), "logit_bias"),  # over [server] max_logit_bias
    (dict(logit_bias={"5": 1000}), "logit_bias"),
    (dict(logit_bias={"99999999": 5}), "logit_bias"),
    (dict(extra_body={"guided_choice": ["yes", "no"]}), "guided_choice"),
    (dict(extra_body={"guided_json": {"type": "object"}}), "guided_json"),
])
def test_a_bad_bias_or_a_guided_field_gets_a_400_and_the_server_keeps_serving(native_client, kw, param):
    ask = dict(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    with pytest.raises(openai.BadRequestError) as info:
        native_client.chat.completions.create(**ask, **kw)
    assert info.value.body["param"] == param and info.value.body["message"]
    assert native_client.chat.completions.create(**ask).choices
