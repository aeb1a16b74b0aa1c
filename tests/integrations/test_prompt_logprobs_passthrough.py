"""LangChain's InferPlugLLM passes prompt_logprobs through: generation_info["prompt_logprobs"] in vLLM's shape,
each prompt token's logprob as HF transformers computes it on the same tiny model."""

from __future__ import annotations

import pytest
import torch

from tests.engine.engine_helpers import hf_model


def test_langchain_llm_returns_prompt_logprobs(tiny_profile, tiny_llama_dir):
    from langchain_inferplug import InferPlugLLM

    llm = InferPlugLLM(profile=tiny_profile, temperature=0, max_tokens=2)
    prompt = "a short prompt"
    info = llm.generate([prompt], prompt_logprobs=1).generations[0][0].generation_info
    ids = llm.backend.tokenizer.encode(prompt)
    with torch.no_grad():
        reference = torch.log_softmax(hf_model(tiny_llama_dir)(torch.tensor([ids])).logits[0].float(), dim=-1)
    entries = info["prompt_logprobs"]
    assert entries[0] is None and len(entries) == len(ids)
    for p, entry in enumerate(entries[1:]):
        assert entry[str(ids[p + 1])]["logprob"] == pytest.approx(float(reference[p, ids[p + 1]]), abs=1e-4)


def test_the_offline_llm_returns_prompt_logprobs_on_its_request_output(tiny_profile, tiny_llama_dir):
    """LLM.generate(..., SamplingParams(prompt_logprobs=k)) fills RequestOutput.prompt_logprobs, as vLLM's does:
    None for the first token, then each token's logprob as HF transformers computes it."""
    from inferplug import LLM, SamplingParams

    llm = LLM(tiny_profile, num_kv_blocks=32)
    ids = llm.engine.tokenizer.encode("a short prompt")
    (out,) = llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=1))
    with torch.no_grad():
        reference = torch.log_softmax(hf_model(tiny_llama_dir)(torch.tensor([ids])).logits[0].float(), dim=-1)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(ids)
    for p, entry in enumerate(out.prompt_logprobs[1:]):
        assert entry.token_id == ids[p + 1]
        assert entry.logprob == pytest.approx(float(reference[p, ids[p + 1]]), abs=1e-4)
