"""The RAG workload: the integrations' corpus and queries, inferplug.rag's layout, document hints."""

import json

import pytest

from inferplug.benchmark.rag import rag_requests
from inferplug.commands import bench
from tests.benchmark.bench_helpers import parse


def test_rag_requests_carry_document_spans(tiny_llama_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama_dir)
    render = lambda m: tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True)  # noqa: E731
    for requests in (rag_requests(5, 7, tok, seed=2, render_chat=render), rag_requests(5, 7, seed=2)):
        assert len(requests) == 5
        for r in requests:
            assert r.output_len == 7 and r.prompt_ids is None and r.prompt_len > 0
            assert 1 <= len(r.documents) <= 4
            for span in r.documents:
                assert 0 <= span.start < span.end <= len(r.prompt)
    # Same seed, same workload: queries and retrievals are reproducible.
    assert [r.prompt for r in rag_requests(3, 4, seed=1)] == [r.prompt for r in rag_requests(3, 4, seed=1)]


@pytest.mark.smollm2
@pytest.mark.slow
def test_rag_bench_on_the_default_model_reuses_cached_prompt_tokens(smollm2_gguf, tmp_path):
    out = tmp_path / "rag.json"
    argv = ["smollm2-135m", "--dataset-name", "rag", "--num-prompts", "3", "--random-output-len", "4",
            "--max-concurrency", "1", "--save-result", str(out), "--no-progress"]
    assert bench.run(parse(*argv)) == 0
    data = json.loads(out.read_text())
    assert data["completed"] == 3 and data["failed"] == 0
    # One request at a time: later prompts reuse at least the shared system-prompt blocks.
    assert data["prefix_cache_hit_rate"] > 0
