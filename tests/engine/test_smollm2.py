"""The real SmolLM2-135M-Instruct GGUF: our engine against HF transformers on the same file (fp32)."""

from __future__ import annotations

import pytest
import torch

from inferplug.quant.linear import quantize_model
from inferplug.types import Request, SamplingParams
from tests.engine.engine_helpers import greedy, make_engine, run_all, tokens_of

pytestmark = pytest.mark.smollm2

QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "List three prime numbers.",
             "Explain gravity to a child in two sentences."]


# fp16: the resolver's default on x86 CPUs computing in fp32 (linears stored fp16 for fbgemm), so the
# product path keeps HF fp32's greedy answers too; its logits move by the fp16 rounding of the weights.
@pytest.mark.parametrize(("weights", "atol"), [(None, 2e-3), ("fp16", 5e-2)])
def test_chat_requests_match_hf_greedy(smollm2_gguf, hf_smollm2, weights, atol):
    engine = make_engine(smollm2_gguf, max_num_batched_tokens=64)
    if weights:
        quantize_model(engine.runner.model, weights)
    prompts = [engine.encode(Request(messages=[{"role": "user", "content": q}]))[0] for q in QUESTIONS]
    params = SamplingParams(temperature=0.0, max_tokens=32)  # stops at EOS, as HF generate does
    requests = [Request(prompt=p, params=params, request_id=str(i)) for i, p in enumerate(prompts)]
    events = run_all(engine, requests[:1], {1: requests[1:3], 3: requests[3:]})
    for i, prompt in enumerate(prompts):
        with torch.no_grad():
            ref = hf_smollm2.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False)
        assert tokens_of(events[str(i)]) == ref[0, len(prompt):].tolist(), f"request {i}"
    with torch.no_grad():
        logits = hf_smollm2(torch.tensor([prompts[0]])).logits[0, -1]
    engine_logits = _last_logits(engine, prompts[0])
    torch.testing.assert_close(engine_logits, logits, atol=atol, rtol=1e-3)


def _last_logits(engine, prompt):
    from inferplug.engine.sampler import Sampler

    captured = {}

    class Capture(Sampler):
        def __call__(self, logits, *args):
            captured["logits"] = logits[0].clone()
            return super().__call__(logits, *args)

    engine.runner.sampler = Capture(engine.runner.sampler.eos_token_ids)
    run_all(engine, [Request(prompt=prompt, params=greedy(1), request_id="logits")])
    return captured["logits"]
