"""bench/rag_cache.py --paper at Llama-7B width for speed (issue 28's performance targets): dummy weights
(`[model] load_format = "dummy"`, random Q4_K_M-style blocks through the GGUF layers), so prefill dominates TTFT as
it does for users; answers are noise and only the times and token counts mean anything.

It writes a model folder (config.json at 7B geometry: width 4096, 32 heads, 8 KV heads, MLP 14336, --layers of the
32; SmolLM2's tokenizer and chat template, so vocab 49152) and a profile for it under --dir, then runs the paper
modes on it: no cache, prefix caching, and RAG-aware with the default recompute ([cache] rag_recompute, or
--policy/--fraction).

    nice .venv/bin/python bench/rag_paper_7b.py --layers 4 --queries 4 --json rag-paper-7b.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from inferplug.benchmark.rag_paper_runs import run_paper
from inferplug.benchmark.real_size_files import Geometry


def write_model(out: Path, layers: int) -> Path:
    """The 7B-width folder and its profile; returns the profile's path."""
    from transformers import AutoTokenizer

    from inferplug.profile import load_profile
    from inferplug.sources import ensure_local

    out.mkdir(parents=True, exist_ok=True)
    gguf = ensure_local(load_profile("smollm2-135m").model)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer.save_pretrained(out)
    g = Geometry(layers=layers, context=8192)
    (out / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": g.vocab, "hidden_size": g.hidden,
        "intermediate_size": g.ffn, "num_hidden_layers": g.layers, "num_attention_heads": g.heads,
        "num_key_value_heads": g.kv_heads, "head_dim": g.head_dim, "max_position_embeddings": g.context,
        "rms_norm_eps": g.rms_eps, "rope_theta": g.rope_theta, "tie_word_embeddings": False,
        "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}))
    profile = out / "rag-7b.toml"
    profile.write_text(f'name = "rag-7b-{layers}l"\nbackend = "native"\n[model]\npath = "{out}"\n'
                       'load_format = "dummy"\n[quantization]\nformat = "gguf"\n[cache]\nmemory = "1GiB"\n'
                       'rag_document_cache = true\n')
    return profile


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4, help="of the 32 at 7B width (2 cores prefill ~40 tok/s at 32)")
    ap.add_argument("--queries", type=int, default=4)
    ap.add_argument("--answer-tokens", type=int, default=4)
    ap.add_argument("--entities", type=int, default=12, help="workshops (and people): 2x this many chunks")
    ap.add_argument("--no-prefix", action="store_true", help="skip the prefix-caching mode (its warm-up and queries)")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/inferplug-rag-7b"))
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    args.profile = str(write_model(args.dir / f"{args.layers}l", args.layers))
    args.fractions = ""  # the profile's own recompute policy only
    run_paper(args)


if __name__ == "__main__":
    main()
