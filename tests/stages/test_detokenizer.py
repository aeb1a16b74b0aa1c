"""Incremental detokenization: multi-byte characters split across tokens, and stop strings across tokens."""

from __future__ import annotations

from inferplug.models.loader import load_tokenizer
from inferplug.stages.detokenizer import IncrementalDetokenizer

TEXT = "Hi 你好, world 🙂! naïve café 😀👍 the end"


def _stream(tokenizer, ids, stop=(), include=False):
    detok = IncrementalDetokenizer(tokenizer, [], list(stop), include)
    pieces, matched = [], None
    for token in ids:
        matched = detok.add(token)
        if matched:
            break
        pieces.append(detok.delta(final=False))
    pieces.append(detok.delta(final=True))
    return pieces, matched


def test_multibyte_text_streams_without_replacement_chars(tiny_llama_dir):
    tokenizer = load_tokenizer(tiny_llama_dir)  # byte-level: a CJK char or emoji spans 3-4 tokens
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    assert len(ids) > len(TEXT)
    pieces, _ = _stream(tokenizer, ids)
    assert "".join(pieces) == TEXT
    assert not any("\ufffd" in p for p in pieces)


def test_text_that_ends_inside_a_character_comes_out_as_the_tokenizers_decode_gives_it(tiny_llama_dir):
    """A generation cut inside a multi-byte character (max_tokens, or a model that writes stray bytes, as a random
    one does) loses nothing: its last bytes come out as U+FFFD at the end, as tokenizer.decode gives them."""
    tokenizer = load_tokenizer(tiny_llama_dir)
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    cut = next(n for n in range(1, len(ids)) if tokenizer.decode(ids[:n]).endswith("\ufffd"))
    pieces, _ = _stream(tokenizer, ids[:cut])
    assert "".join(pieces) == tokenizer.decode(ids[:cut])
    assert "\ufffd" not in "".join(pieces[:-1])  # held back while the stream ran


def test_stop_string_spanning_tokens_is_cut_and_never_leaked(tiny_llama_dir):
    tokenizer = load_tokenizer(tiny_llama_dir)
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    pieces, matched = _stream(tokenizer, ids, stop=["好, wor"])
    assert matched == "好, wor"
    assert "".join(pieces) == "Hi 你"
    pieces, _ = _stream(tokenizer, ids, stop=["好, wor"], include=True)
    assert "".join(pieces) == "Hi 你好, wor"


def test_the_earliest_stop_string_wins_whatever_the_list_order(tiny_llama_dir):
    tokenizer = load_tokenizer(tiny_llama_dir)
    ids = tokenizer.encode("he", add_special_tokens=False)
    assert len(ids) == 1  # "h" and "e" arrive in the same token
    pieces, matched = _stream(tokenizer, ids, stop=["e", "h"])
    assert (matched, "".join(pieces)) == ("h", "")
    pieces, matched = _stream(tokenizer, ids, stop=["h", "he"], include=True)  # a tie: the longest wins
    assert (matched, "".join(pieces)) == ("he", "he")


def test_stray_prompt_bytes_do_not_spoil_a_byte_fallback_reply(tmp_path):
    """A SentencePiece byte-fallback decoder (Gemma's, Llama 2's) turns a whole run of byte tokens into U+FFFD once one
    byte in it is stray: a prompt ending in a stray byte must not take the reply's bytes down with it."""
    from tests.gemma_tokenizer import save_gemma_tokenizer

    from transformers import AutoTokenizer

    save_gemma_tokenizer(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    reply = tokenizer.encode('{"a": 1}', add_special_tokens=False)  # byte tokens: the tiny vocabulary has no {, ", :
    stray = tokenizer.convert_tokens_to_ids("<0xC3>")  # starts a 2-byte character the reply does not finish
    detok = IncrementalDetokenizer(tokenizer, [5, stray], [])
    for token in reply:
        detok.add(token)
    assert detok.delta(final=True) == '{"a": 1}'
