"""Write a Llama-7B-width GGUF with few layers and random Q4_1 weights, for bench/prefill.py: prefill at 7B shapes
(hidden 4096, 32 heads of 128, 8 KV heads, MLP 14336: qkv 4096 x 6144, gate_up 4096 x 28672) in minutes, ours and
llama.cpp on the same file. The tokenizer (and its vocabulary) is SmolLM2's, copied from its GGUF; a whole 7B
model's prefill is about 32 times one layer's. (inferplug/benchmark/random_models.py writes it.)

    .venv/bin/python bench/make_7b_width_gguf.py SmolLM2-135M-Instruct.Q4_1.gguf /tmp/llama7b-width-2l.gguf --layers 2
    .venv/bin/python bench/prefill.py --profiles /tmp/llama7b-width-2l.toml --lengths 512
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main() -> None:
    from inferplug.benchmark.random_models import write_random_gguf
    from inferplug.models.config import ModelConfig
    from inferplug.models.gguf import read_gguf

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tokenizer_gguf", type=Path, help="a GGUF whose tokenizer to copy (SmolLM2's)")
    parser.add_argument("out", type=Path)
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args()
    tokenizer = {k: v for k, v in read_gguf(args.tokenizer_gguf).metadata.items() if k.startswith("tokenizer.")}
    config = ModelConfig(architecture="llama", vocab_size=len(tokenizer["tokenizer.ggml.tokens"]), hidden_size=4096,
                         intermediate_size=14336, num_hidden_layers=args.layers, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=128, max_position_embeddings=4096, rms_norm_eps=1e-5)
    write_random_gguf(args.out, config, tokenizer, type_of=lambda *_: "Q4_1")
    print(f"wrote {args.out} ({args.layers} layers, vocab {config.vocab_size})")


if __name__ == "__main__":
    main()
