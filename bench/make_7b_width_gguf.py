"""Write a Llama-7B-width GGUF with few layers and random Q4_1 weights, for bench/prefill.py: prefill at 7B shapes
(hidden 4096, 32 heads of 128, 8 KV heads, MLP 14336: qkv 4096 x 6144, gate_up 4096 x 28672) in minutes, ours and
llama.cpp on the same file. The tokenizer (and its vocabulary, the tied embedding's rows) is SmolLM2's, copied from
its GGUF; a whole 7B model's prefill is about 32 times one layer's.

    .venv/bin/python bench/make_7b_width_gguf.py SmolLM2-135M-Instruct.Q4_1.gguf /tmp/llama7b-width-2l.gguf --layers 2
    .venv/bin/python bench/prefill.py --profiles /tmp/llama7b-width-2l.toml --lengths 512
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, MLP = 4096, 32, 8, 128, 14336


def tokenizer_fields(reader) -> list[tuple[str, object, object]]:
    """(key, value, GGUF type) of each tokenizer.* field of `reader`'s file (arrays: their items' type)."""
    from gguf import GGUFValueType

    return [(key, field.contents(), field.types[1] if field.types[0] == GGUFValueType.ARRAY else field.types[0])
            for key, field in reader.fields.items() if key.startswith("tokenizer.")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tokenizer_gguf", type=Path, help="a GGUF whose tokenizer to copy (SmolLM2's)")
    parser.add_argument("out", type=Path)
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args()
    import gguf
    from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
    from gguf.quants import quantize

    reader = GGUFReader(args.tokenizer_gguf)
    tokenizer = tokenizer_fields(reader)
    vocab = len(next(value for key, value, _ in tokenizer if key == "tokenizer.ggml.tokens"))
    writer = GGUFWriter(args.out, "llama")
    writer.add_name("llama-7b-width random")
    writer.add_context_length(4096)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(args.layers)
    writer.add_feed_forward_length(MLP)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1)
    for key, value, kind in tokenizer:
        if isinstance(value, list):
            writer.add_array(key, value)
        else:
            writer.add_key_value(key, value, kind)
    rng = np.random.default_rng(0)

    def weight(name: str, rows: int, cols: int) -> None:  # rows = outputs; GGUF lists the shape inner dim first
        values = (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float32)
        writer.add_tensor(name, quantize(values, GGMLQuantizationType.Q4_1), raw_dtype=GGMLQuantizationType.Q4_1)

    embedding = (rng.standard_normal((vocab, HIDDEN), dtype=np.float32) * 0.02).astype(np.float16)
    writer.add_tensor("token_embd.weight", embedding)
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    for i in range(args.layers):
        for norm in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{i}.{norm}.weight", np.ones(HIDDEN, dtype=np.float32))
        weight(f"blk.{i}.attn_q.weight", HEADS * HEAD_DIM, HIDDEN)
        weight(f"blk.{i}.attn_k.weight", KV_HEADS * HEAD_DIM, HIDDEN)
        weight(f"blk.{i}.attn_v.weight", KV_HEADS * HEAD_DIM, HIDDEN)
        weight(f"blk.{i}.attn_output.weight", HIDDEN, HEADS * HEAD_DIM)
        weight(f"blk.{i}.ffn_gate.weight", MLP, HIDDEN)
        weight(f"blk.{i}.ffn_up.weight", MLP, HIDDEN)
        weight(f"blk.{i}.ffn_down.weight", HIDDEN, MLP)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"wrote {args.out} ({args.layers} layers, vocab {vocab})")


if __name__ == "__main__":
    main()
