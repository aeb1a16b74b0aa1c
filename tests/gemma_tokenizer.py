"""A tiny Gemma-style tokenizer for tiny random Gemma 4 checkpoints.

llama.cpp's Gemma 4 converter (conversion/gemma.py, `Gemma4Model.set_vocab`) reads the vocabulary only through
`gguf.LlamaHfVocab`, which accepts nothing but a SentencePiece-style BPE tokenizer.json: model BPE with byte_fallback
and a "Sequence" decoder. The byte-level GPT-2-style BPE of tests/conftest.py is refused, so the tiny Gemma 4 models
get this one instead: Gemma's layout ("▁" for spaces, <0xXX> byte tokens, a few merges), small but real, so text
round-trips through encode/decode."""

from __future__ import annotations

import json
from pathlib import Path

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]  # ids 0..3, as in Gemma
TURNS = ["<start_of_turn>", "<end_of_turn>"]
CHARS = ["▁", "t", "h", "e"]
MERGES = [("▁", "t"), ("h", "e"), ("▁t", "he")]
SIZE = len(SPECIALS) + 256 + len(CHARS) + len(MERGES) + len(TURNS)  # the vocabulary: 269 tokens
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def save_gemma_tokenizer(out: Path) -> None:
    """Write tokenizer.json + tokenizer_config.json to out; name its specials in config.json/generation_config.json."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, processors
    from transformers import PreTrainedTokenizerFast

    pieces = SPECIALS + [f"<0x{b:02X}>" for b in range(256)] + CHARS + [a + b for a, b in MERGES]
    vocab = {piece: i for i, piece in enumerate(pieces + TURNS)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=MERGES, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(Regex(" "), "▁")  # Gemma's: no prefix space, no pre-tokenizer split
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS + TURNS])
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                       special_tokens=[("<bos>", vocab["<bos>"])])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                   unk_token="<unk>", additional_special_tokens=TURNS, chat_template=CHAT_TEMPLATE)
    fast.save_pretrained(out)
    ids = {"bos_token_id": vocab["<bos>"], "eos_token_id": vocab["<eos>"], "pad_token_id": vocab["<pad>"]}
    ends = {"eos_token_id": [vocab["<eos>"], vocab["<end_of_turn>"]]}  # as Gemma's: a chat turn ends generation too
    for name, extra in (("config.json", {}), ("generation_config.json", ends)):
        path = out / name
        if path.is_file():
            path.write_text(json.dumps({**json.loads(path.read_text()), **ids, **extra}, indent=2))
