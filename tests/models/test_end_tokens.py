"""The tokens that end a reply: a tiny gpt-oss whose tokenizer holds harmony's control tokens, as an HF dir (its
generation_config.json lists <|return|> and <|call|>, config.json only <|return|>) and as the GGUF llama.cpp's own
converter writes from it (one EOS id). Ours stop at both from either form, and llama.cpp's end-of-generation set,
read through llama-cpp-python, says the same of those tokens (and of <|end|>, which ends a message, not the reply)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferplug.models.loader import read_config
from tests.conftest import _save_tiny
from tests.models.llama_cpp_reference import convert, need_llama_cpp

HARMONY = ["<|return|>", "<|call|>", "<|end|>", "<|start|>", "<|channel|>", "<|message|>"]


@pytest.fixture(scope="module")
def harmony_dir(tmp_path_factory) -> tuple[Path, dict[str, int]]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    out = _save_tiny("gpt_oss", tmp_path_factory.mktemp("gpt-oss-harmony"))
    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab["Ġt"] = len(vocab)  # a merge: llama.cpp's BPE vocabulary needs one
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("Ġ", "t")]))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>", *HARMONY])  # 264 tokens: the tiny model's 265-row embedding holds them
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|return|>", pad_token="<|endoftext|>").save_pretrained(out)
    ids = {t: tok.token_to_id(t) for t in HARMONY}
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "eos_token_id": ids["<|return|>"]}))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": [ids["<|return|>"], ids["<|call|>"]]}))
    return out, ids


def test_an_hf_dir_ends_where_its_generation_config_says(harmony_dir):
    path, ids = harmony_dir
    assert read_config(path).eos_token_ids == [ids["<|return|>"], ids["<|call|>"]]


def test_a_gpt_oss_gguf_ends_at_return_and_call_as_llama_cpp_does(harmony_dir, tmp_path):
    llama_cpp = need_llama_cpp()
    path, ids = harmony_dir
    gguf = convert(path, tmp_path / "harmony.gguf")
    ours = set(read_config(gguf).eos_token_ids)
    llm = llama_cpp.Llama(model_path=str(gguf), vocab_only=True, verbose=False)
    try:
        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        theirs = {t: bool(llama_cpp.llama_vocab_is_eog(vocab, i)) for t, i in ids.items()}
    finally:
        llm.close()
    assert theirs == {t: t in ("<|return|>", "<|call|>") for t in HARMONY}
    assert {t for t, i in ids.items() if i in ours} == {"<|return|>", "<|call|>"}
