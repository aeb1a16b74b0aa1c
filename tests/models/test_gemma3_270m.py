"""The second real model: Gemma 3 270M (base, Q4_K_M: Q5_0, Q4_K, Q6_K and Q8_0 tensors; 18 layers, five 512-token
sliding windows to each full layer, a 262k SentencePiece vocabulary), run in its file's bits against llama.cpp on
the same file, teacher-forced on the shipped quality text as llama.cpp's perplexity tool does it (512-token chunks,
BOS first, the second half scored)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from inferplug.quality import PositionStats, chunks, compare_rows, quality_text, scored_logprobs, summarize
from inferplug.types import Request
from tests.engine.engine_helpers import greedy, make_engine, run_all, text_of
from tests.models.llama_cpp_reference import need_llama_cpp

pytestmark = [pytest.mark.gemma3_270m, pytest.mark.slow]
CHUNKS = 3  # 765 scored positions: top-1 agreement's standard error is about 0.6 points


@pytest.fixture(scope="module")
def engine(gemma3_270m_gguf):
    return make_engine(gemma3_270m_gguf, weight_format="gguf", max_num_batched_tokens=512)


def test_perplexity_and_top1_agree_with_llama_cpp_on_the_same_file(engine, gemma3_270m_gguf):
    llama_cpp = need_llama_cpp()
    ids = engine.tokenizer.encode(quality_text(), add_special_tokens=False)
    llm = llama_cpp.Llama(model_path=str(gemma3_270m_gguf), n_ctx=512, n_batch=512, logits_all=True, n_threads=2,
                          verbose=False)
    parts = []
    try:
        for chunk in chunks(ids, limit=CHUNKS):
            chunk = [engine.model_config.bos_token_id, *chunk[1:]]
            rows, targets = scored_logprobs(engine, chunk)
            llm.reset()
            llm.eval(chunk)
            reference = torch.log_softmax(torch.tensor(np.array(llm.scores[len(chunk) // 2:len(chunk) - 1])), -1)
            parts.append(compare_rows(reference, rows, targets))
    finally:
        llm.close()
    quality = summarize(PositionStats.cat(parts))  # ppl_ref: llama.cpp's; ppl: ours
    assert abs(quality.ppl / quality.ppl_ref - 1) < 0.01, quality
    assert quality.top1 >= 95.0, quality


@pytest.mark.parametrize("prompt,answer", [
    ("The capital of France is Paris. The capital of Germany is", "Berlin"),
    ("One, two, three, four,", "five"),
])
def test_completions_make_sense(engine, prompt, answer):
    request = Request(prompt=prompt, params=greedy(8))
    assert answer in text_of(run_all(engine, [request])[request.request_id])


def test_the_default_path_answers_as_fp32_does(engine, gemma3_270m_gguf):
    """The precision rule's factual check on the second model (docs/profiles.md): the default CPU path (the file's
    blocks, bf16 or fp32 prompt GEMMs, fp16 K/V) completes the capital question with Paris, token for token as the
    fp32 reference path (the file dequantized, fp32 everything) does. Completion-style: the base model has no chat
    template."""
    from inferplug.backends.native import build_engine
    from inferplug.hardware import probe
    from inferplug.profile import load_profile
    from inferplug.resolver import resolve

    prompt = "Question: What is the capital of France?\nAnswer:"
    default = build_engine(profile := load_profile(str(gemma3_270m_gguf)), resolve(profile, probe()))
    reference = make_engine(gemma3_270m_gguf, max_num_batched_tokens=512)  # fp32, floats, fp32 K/V

    def answer(eng):
        request = Request(prompt=prompt, params=greedy(12))
        events = run_all(eng, [request])[request.request_id]
        return [t for e in events for t in e.token_ids], "".join(e.text for e in events)

    (tokens, text), (ref_tokens, _) = answer(default), answer(reference)
    assert "Paris" in text and tokens == ref_tokens
