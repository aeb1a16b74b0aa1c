"""Real-size random model files for bench/real_size.py (and the geometry bench/rag_paper_7b.py writes): a Q4_K_M-style
(or Q5_K_M) GGUF, an AutoAWQ GEMM and a GPTQ act-order checkpoint at Llama/Mistral-7B geometry (or fewer layers), all
with SmolLM2's tokenizer (so vocab 49152), written by inferplug/benchmark/random_models.py one tensor at a time
(`check_gguf` confirms the activations' scale with gguf-py's dequantization).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

GROUP = 128  # AWQ / GPTQ group size (inferplug/benchmark/random_models.py)
WRITER = 2  # bump when the files written change: a stamp of another version rewrites them


@dataclass(frozen=True)
class Geometry:
    layers: int = 32
    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    ffn: int = 14336
    vocab: int = 49152  # SmolLM2's tokenizer; a larger vocabulary pads it with tokens nobody writes
    context: int = 32768
    rms_eps: float = 1e-5
    rope_theta: float = 10000.0
    family: str = "llama"  # the GGUF architecture written: "llama", "qwen3" (QK-norm weights too), "qwen3moe", "gpt-oss"
    head_dim_override: int = 0  # a head width other than hidden / heads (Qwen3-30B-A3B: 128 at width 2048)
    experts: int = 0  # an MoE in every layer (qwen3moe): its experts, those a token uses, and each one's MLP width
    experts_used: int = 0
    expert_ffn: int = 0
    # Gemma 4: its full layers' head width and KV heads (V from K there), and the window of the other five in six
    global_head_dim: int = 0
    global_kv_heads: int = 0
    window: int = 0
    # Qwen3.5: its Gated DeltaNet layers' q/k and value heads (of linear_head_dim), three to every attending layer
    linear_key_heads: int = 0
    linear_value_heads: int = 0
    linear_head_dim: int = 0
    shared_expert_ffn: int = 0  # Qwen3.5-MoE: the MLP every row runs beside its experts

    @property
    def head_dim(self) -> int:
        return self.head_dim_override or self.hidden // self.heads


# Qwen3-8B (its config.json): 36 layers, width 4096, 32 heads and 8 KV heads of 128, MLP 12288, vocabulary 151,936
GEOMETRIES = {"llama-7b": Geometry(),
              "qwen3-8b": Geometry(layers=36, ffn=12288, vocab=151936, context=40960, rms_eps=1e-6, rope_theta=1e6,
                                   family="qwen3"),
              # Qwen3-30B-A3B (its config.json): 48 layers, width 2048, 32 heads and 4 KV heads of 128, 128 experts of
              # MLP 768 with 8 a token, vocabulary 151,936
              "qwen3-30b-a3b": Geometry(layers=48, hidden=2048, kv_heads=4, ffn=6144, vocab=151936, context=40960,
                                        rms_eps=1e-6, rope_theta=1e6, family="qwen3moe", head_dim_override=128,
                                        experts=128, experts_used=8, expert_ffn=768),
              # gpt-oss-20b (its config.json): 24 layers, width 2880, 64 heads and 8 KV heads of 64, 32 experts of MLP
              # 2880 with 4 a token, vocabulary 201,088; MXFP4 experts, Q8_0 elsewhere (random_models.gpt_oss_type)
              "gpt-oss-20b": Geometry(layers=24, hidden=2880, heads=64, kv_heads=8, ffn=2880, vocab=201088,
                                      context=131072, rms_eps=1e-5, rope_theta=150000.0, family="gpt-oss",
                                      head_dim_override=64, experts=32, experts_used=4, expert_ffn=2880),
              # Gemma 4 26B-A4B (its config.json): 30 layers, width 2816, 16 heads; window layers 8 KV heads of 256, full
              # ones (every sixth) 2 of 512 with V from K; a dense MLP of 2112 beside 128 experts of 704 with 8 a
              # token; vocabulary 262,144 (bench/real_size.py --layers 12: the depth that fits beside a peer)
              "gemma4-26b-a4b": Geometry(layers=30, hidden=2816, heads=16, kv_heads=8, ffn=2112, vocab=262144,
                                         context=131072, rms_eps=1e-6, rope_theta=1e6, family="gemma4",
                                         head_dim_override=256, experts=128, experts_used=8, expert_ffn=704,
                                         global_head_dim=512, global_kv_heads=2, window=1024),
              # Gemma 3 4B (its config.json): 34 layers, width 2560, 8 heads and 4 KV heads of 256, five layers in six
              # in a 1,024-token window, MLP 10240, vocabulary 262,208 (the GGUF's: 262,144 here)
              "gemma3-4b": Geometry(layers=34, hidden=2560, heads=8, kv_heads=4, ffn=10240, vocab=262144,
                                    context=131072, rms_eps=1e-6, rope_theta=1e6, family="gemma3",
                                    head_dim_override=256, window=1024),
              # Qwen3.5-9B (its model card): 32 layers, width 4096, 8 x (3 Gated DeltaNet (16 q/k and 32 value heads
              # of 128) then 1 gated attention (16 heads and 4 KV heads of 256, RoPE on 64 dims of each)), MLP 12288,
              # vocabulary 248,320
              "qwen35-9b": Geometry(layers=32, hidden=4096, heads=16, kv_heads=4, ffn=12288, vocab=248320,
                                    context=262144, rms_eps=1e-6, rope_theta=1e7, family="qwen35",
                                    head_dim_override=256, linear_key_heads=16, linear_value_heads=32,
                                    linear_head_dim=128),
              # Qwen3.5-35B-A3B (its config.json's text_config): 40 layers, width 2048, 10 x (3 Gated DeltaNet (16 q/k
              # and 32 value heads of 128) then 1 gated attention (16 heads and 2 KV heads of 256)), 256 experts of
              # MLP 512 with 8 a token and a shared one of 512, vocabulary 248,320 (bench/real_size.py --layers 12:
              # the depth that fits beside a peer)
              "qwen35-35b-a3b": Geometry(layers=40, hidden=2048, heads=16, kv_heads=2, ffn=512, vocab=248320,
                                         context=262144, rms_eps=1e-6, rope_theta=1e7, family="qwen35moe",
                                         head_dim_override=256, experts=256, experts_used=8, expert_ffn=512,
                                         shared_expert_ffn=512, linear_key_heads=16, linear_value_heads=32,
                                         linear_head_dim=128)}


def config(g: Geometry):
    """The geometry as the ModelConfig the writers take."""
    from inferplug.models.config import ModelConfig
    from inferplug.models.families import gemma4
    from inferplug.models.registry import gguf_family

    extra = {}
    if g.family in ("qwen35", "qwen35moe"):
        from inferplug.models.families import qwen35

        extra = {"linear_layers": tuple((i + 1) % qwen35.FULL_ATTENTION_INTERVAL != 0 for i in range(g.layers)),
                 "linear_num_key_heads": g.linear_key_heads, "linear_num_value_heads": g.linear_value_heads,
                 "linear_key_head_dim": g.linear_head_dim, "linear_value_head_dim": g.linear_head_dim,
                 "linear_conv_kernel_dim": 4, "attention_output_gate": True,
                 "rope_scaling": {"rope_type": "partial", "partial_rotary_factor": 0.25},
                 "shared_expert_intermediate_size": g.shared_expert_ffn}
    if g.family == "gemma3":
        from inferplug.models.families import gemma3

        extra = {"layer_windows": tuple(0 if (i + 1) % gemma3.SLIDING_PATTERN == 0 else g.window for i in range(g.layers)),
                 "rope_local_theta": 10000.0, "attention_scale": g.head_dim**-0.5, "tie_word_embeddings": True,
                 "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
    if g.family == "gemma4":  # five window layers to a full one, the full ones wider with V from K
        kinds = ["full_attention" if (i + 1) % gemma4.SLIDING_PATTERN == 0 else "sliding_attention"
                 for i in range(g.layers)]
        full = [kind == "full_attention" for kind in kinds]
        extra = {**gemma4.layer_geometry(kinds, g.window, g.head_dim, g.global_head_dim,
                                         [g.global_kv_heads if f else g.kv_heads for f in full], 0, full),
                 "dense_beside_moe": True,
                 "rope_scaling": {"rope_type": "proportional", "partial_rotary_factor": 0.25},
                 "rope_local_theta": 10000.0, "final_logit_softcap": 30.0, "tie_word_embeddings": True}
    return ModelConfig(architecture=g.family, vocab_size=g.vocab, hidden_size=g.hidden, intermediate_size=g.ffn,
                       num_hidden_layers=g.layers, num_attention_heads=g.heads, num_key_value_heads=g.kv_heads,
                       head_dim=g.head_dim, max_position_embeddings=g.context, rms_norm_eps=g.rms_eps,
                       rope_theta=g.rope_theta, family=gguf_family(g.family, g.family).name, num_experts=g.experts,
                       num_experts_per_tok=g.experts_used, moe_intermediate_size=g.expert_ffn, norm_topk_prob=True,
                       moe_layers=(g.experts > 0,) * g.layers, **extra)


def check_gguf(path: Path) -> dict[str, float]:
    """gguf-py's dequantization of a few tensors: every value finite, and each linear's E[w^2] * fan_in near 1."""
    import gguf

    reader = gguf.GGUFReader(path)
    picks = [t for t in reader.tensors if t.name.startswith("blk.0.") or t.name == "output.weight"]
    out = {}
    for t in picks:
        data = t.data.reshape(-1, t.data.shape[-1])  # an MoE's experts: their rows one after another
        w = gguf.quants.dequantize(data[:64], t.tensor_type)  # 64 rows are enough for the statistics
        if not np.isfinite(w).all():
            raise ValueError(f"{t.name} dequantizes to non-finite values")
        out[t.name] = float(np.mean(w.astype(np.float64) ** 2) * w.shape[-1]) if len(t.shape) > 1 else float(w.mean())
    return out


# ---- what is on disk ----------------------------------------------------------------------------------------------

GGUF_MIXES = ("Q4_K_M", "Q5_K_M")  # llama.cpp's mixes the GGUF can be written in (models/gguf_random.py)


def model_path(root: Path, fmt: str, g: Geometry, mix: str = "Q4_K_M") -> Path:
    name = f"random-{g.family}-{g.layers}L"
    mix = "MXFP4" if g.family == "gpt-oss" else mix  # its files' own mix (random_models.gpt_oss_type)
    return root / (f"{name}-{mix}.gguf" if fmt == "gguf" else f"{name}-{fmt}-g{GROUP}")


def ensure_model(root: Path, fmt: str, g: Geometry, tokenizer_gguf: Path, mix: str = "Q4_K_M") -> Path:
    """The model file (dir) for `fmt` (a GGUF in `mix`), written unless a finished one with the same geometry is there."""
    path = model_path(root, fmt, g, mix)
    stamp = path.with_name(path.name + ".done.json")
    if stamp.is_file() and json.loads(stamp.read_text()) == asdict(g) | {"writer": WRITER}:
        return path
    root.mkdir(parents=True, exist_ok=True)
    print(f"writing {path} ...", flush=True)
    from inferplug.benchmark.random_models import write_random_checkpoint, write_random_gguf
    from inferplug.models.gguf import read_gguf
    from inferplug.models.gguf_random import q4_k_m_type, q5_k_m_type
    from inferplug.models.loader import load_tokenizer

    if fmt == "gguf":
        tokenizer = padded_vocabulary({k: v for k, v in read_gguf(tokenizer_gguf).metadata.items()
                                       if k.startswith("tokenizer.")}, g.vocab)
        if g.family == "gemma4":
            from inferplug.benchmark.random_gemma4 import write_random_gemma4_gguf

            write_random_gemma4_gguf(path, config(g), tokenizer)
        elif g.family in ("qwen35", "qwen35moe"):
            from inferplug.benchmark.random_qwen35 import write_random_qwen35_gguf

            write_random_qwen35_gguf(path, config(g), tokenizer)
        else:
            write_random_gguf(path, config(g), tokenizer, {"Q4_K_M": q4_k_m_type, "Q5_K_M": q5_k_m_type}[mix])
        print(f"  gguf-py dequantization, E[w^2] * fan_in: {check_gguf(path)}", flush=True)
    else:
        write_random_checkpoint(path, config(g), fmt, load_tokenizer(tokenizer_gguf))
    stamp.write_text(json.dumps(asdict(g) | {"writer": WRITER}))
    return path


def padded_vocabulary(tokenizer: dict, vocab: int) -> dict:
    """A GGUF's tokenizer keys with its token list padded to `vocab` by user-defined tokens no text encodes to (a
    Qwen3-size head and embedding over SmolLM2's BPE)."""
    tokens, types = tokenizer["tokenizer.ggml.tokens"], tokenizer.get("tokenizer.ggml.token_type")
    extra = vocab - len(tokens)
    if extra <= 0:
        return tokenizer
    padded = {**tokenizer, "tokenizer.ggml.tokens": [*tokens, *(f"<|unused_{i}|>" for i in range(extra))]}
    if types is not None:
        padded["tokenizer.ggml.token_type"] = [*types, *([4] * extra)]  # llama.cpp's LLAMA_TOKEN_TYPE_USER_DEFINED
    return padded


def files_of(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]


def decode_bytes(path: Path) -> int:
    """The bytes one decode step of one stream reads from the file: every weight but the embedding (one row of it is
    read), and of an MoE's expert tensors the share its used experts hold."""
    if path.is_file():
        import gguf

        reader = gguf.GGUFReader(path)
        fields = {f.name: f for f in reader.fields.values()}
        arch = bytes(fields["general.architecture"].parts[-1]).decode()
        share = 1.0
        if f"{arch}.expert_count" in fields:
            share = int(fields[f"{arch}.expert_used_count"].parts[-1][0]) / int(fields[f"{arch}.expert_count"].parts[-1][0])
        return round(sum(int(t.n_bytes) * (share if "_exps." in t.name else 1.0) for t in reader.tensors
                         if t.name != "token_embd.weight"))
    from safetensors import safe_open

    total = 0
    for file in path.glob("*.safetensors"):
        with safe_open(file, "np") as f:
            for name in f.keys():
                if "embed_tokens" not in name:
                    sl = f.get_slice(name)
                    total += int(np.prod(sl.get_shape())) * np.dtype(_NP_DTYPES[sl.get_dtype()]).itemsize
    return total


_NP_DTYPES = {"F16": np.float16, "F32": np.float32, "I32": np.int32, "BF16": np.uint16}
