"""Compiled grammars are cached under a bound: a client sending a new schema with every request cannot grow the
server without limit (xgrammar's own default keeps every grammar)."""

from __future__ import annotations


def test_the_grammar_cache_stays_under_its_bound(tiny_llama_dir):
    from transformers import AutoTokenizer

    from inferplug.engine import guided

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    compiler = guided._compiler_for(tokenizer)
    assert compiler.cache_limit_bytes == guided.GRAMMAR_CACHE_BYTES
    for i in range(40):  # distinct schemas, as a hostile client sends them
        guided.compile_json_schema(tokenizer, {"type": "object", "properties": {f"k{i}": {"enum": [str(i)]}}})
    assert 0 < compiler.get_cache_size_bytes() <= guided.GRAMMAR_CACHE_BYTES
