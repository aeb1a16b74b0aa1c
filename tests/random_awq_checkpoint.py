"""A random AWQ GEMM checkpoint at any Llama geometry, written shard by shard (one decoder layer a shard), so a
7B-sized one (bench: load time and peak memory) never sits in memory whole. Random words are valid AWQ: every
nibble is a code 0..15, and the scales are positive fp16.

    python tests/random_awq_checkpoint.py OUT_DIR [--layers 32 --hidden 4096 --heads 32 --kv-heads 8
                                                    --intermediate 14336 --vocab 32000]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

GROUP = 128


def write_random_awq(out: Path, *, layers: int, hidden: int, heads: int, kv_heads: int, intermediate: int,
                     vocab: int, seed: int = 0) -> Path:
    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    head_dim = hidden // heads
    linears = {"self_attn.q_proj": (hidden, hidden), "self_attn.k_proj": (hidden, kv_heads * head_dim),
               "self_attn.v_proj": (hidden, kv_heads * head_dim), "self_attn.o_proj": (hidden, hidden),
               "mlp.gate_proj": (hidden, intermediate), "mlp.up_proj": (hidden, intermediate),
               "mlp.down_proj": (intermediate, hidden)}

    def words(*shape):
        return torch.randint(-(1 << 31), 1 << 31, shape, dtype=torch.int32, generator=gen)

    def floats(*shape, scale=0.02):
        return (torch.rand(*shape, generator=gen) * scale + scale / 4).half()

    weight_map = {}

    def save(tensors: dict, name: str):
        save_file(tensors, str(out / name))
        weight_map.update(dict.fromkeys(tensors, name))

    save({"model.embed_tokens.weight": floats(vocab, hidden), "model.norm.weight": floats(hidden, scale=1.0),
          "lm_head.weight": floats(vocab, hidden)}, "model-floats.safetensors")
    for i in range(layers):
        shard = {f"model.layers.{i}.input_layernorm.weight": floats(hidden, scale=1.0),
                 f"model.layers.{i}.post_attention_layernorm.weight": floats(hidden, scale=1.0)}
        for module, (n_in, n_out) in linears.items():
            prefix = f"model.layers.{i}.{module}"
            shard[f"{prefix}.qweight"] = words(n_in, n_out // 8)
            shard[f"{prefix}.qzeros"] = words(n_in // GROUP, n_out // 8)
            shard[f"{prefix}.scales"] = floats(n_in // GROUP, n_out)
        save(shard, f"model-layer{i:03d}.safetensors")
    (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab, "hidden_size": hidden,
              "intermediate_size": intermediate, "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": kv_heads, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
              "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "float16",
              "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": GROUP, "version": "gemm",
                                      "zero_point": True}}
    (out / "config.json").write_text(json.dumps(config))
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    for flag, default in (("layers", 32), ("hidden", 4096), ("heads", 32), ("kv-heads", 8), ("intermediate", 14336),
                          ("vocab", 32000)):
        parser.add_argument(f"--{flag}", type=int, default=default)
    args = parser.parse_args()
    write_random_awq(args.out, layers=args.layers, hidden=args.hidden, heads=args.heads, kv_heads=args.kv_heads,
                     intermediate=args.intermediate, vocab=args.vocab)
