"""Constrained decoding: random logits masked by the guide always decode to schema-valid JSON."""

from __future__ import annotations

import json

import pytest

from inferplug.errors import RequestError

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "count": {"type": "integer"},
        "kind": {"enum": ["a", "b"]},
    },
    "required": ["name", "count", "kind"],
}


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama_dir)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_random_logits_decode_to_valid_json(tokenizer, seed, dtype):
    import torch

    from inferplug.engine.guided import make_guide

    guide = make_guide(tokenizer, SCHEMA)
    gen = torch.Generator().manual_seed(seed)
    vocab = len(tokenizer) + 7  # a model's logits may be wider than the tokenizer
    out: list[int] = []
    for _ in range(400):
        logits = torch.randn(vocab, generator=gen).to(getattr(torch, dtype))
        guide.fill_mask(logits)
        assert torch.isinf(logits[len(tokenizer):]).all()
        token = int(torch.argmax(logits.float()))
        assert guide.accept(token)
        out.append(token)
        if guide.is_terminated():
            break
    assert guide.is_terminated()
    assert out[-1] == tokenizer.eos_token_id
    # xgrammar lets raw control characters into strings (random logits pick them), so parse leniently.
    value = json.loads(tokenizer.decode(out[:-1]), strict=False)
    assert set(value) == {"name", "count", "kind"} and value["kind"] in ("a", "b")
    assert isinstance(value["count"], int) and len(value["name"]) <= 8


def test_bad_schema_is_a_request_error(tokenizer):
    from inferplug.engine.guided import make_guide

    with pytest.raises(RequestError, match="json_schema cannot be compiled"):
        make_guide(tokenizer, {"type": "no-such-type"})
