"""A draft model cut from a checkpoint: its embeddings, first layers, final norm and head (a layer-skip draft,
as in self-speculative decoding, Zhang et al. 2023), saved as an HF Llama directory with the same tokenizer.

It shares the target's tokenizer by construction, so it serves as a [speculative] draft_model where no smaller
model of the family is at hand (tests and bench/speculative.py use it on SmolLM2).
"""

from __future__ import annotations

import json
from pathlib import Path


def save_layer_skip_draft(source: Path, out: Path, num_layers: int) -> Path:
    """Write the draft of `source` (an HF directory or GGUF file, as loader.py reads them) to `out`."""
    import torch
    from safetensors.torch import save_file

    from inferplug.models.loader import load_tokenizer, load_weights, read_config

    config = read_config(source)
    if config.family != "llama":
        raise ValueError(f"a layer-skip draft is written as a Llama directory, and {source} is a {config.family} "
                         "model; give [speculative] draft_model a small model of its own family instead")
    if not 1 <= num_layers <= config.num_hidden_layers:
        raise ValueError(f"a draft of {source} keeps 1 to {config.num_hidden_layers} layers, not {num_layers}")
    keep = tuple(f"model.layers.{i}." for i in range(num_layers))
    weights = {name: tensor.float().contiguous() for name, tensor in load_weights(source, torch.float32).items()
               if not name.startswith("model.layers.") or name.startswith(keep)}
    if config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)  # one tensor for both, as HF saves tied weights
    out.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    hf = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
        "num_hidden_layers": num_layers, "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads, "head_dim": config.head_dim,
        "max_position_embeddings": config.max_position_embeddings, "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta, "rope_scaling": config.rope_scaling,
        "tie_word_embeddings": config.tie_word_embeddings, "attention_bias": config.attention_bias,
        "bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_ids or None,
        "torch_dtype": "float32",
    }
    (out / "config.json").write_text(json.dumps(hf, indent=2))
    load_tokenizer(source).save_pretrained(out)
    return out
