"""Real-size random model files for bench/real_size.py: a Q4_K_M-style GGUF, an AutoAWQ GEMM and a GPTQ act-order
checkpoint at Llama/Mistral-7B geometry (or fewer layers), all with SmolLM2's tokenizer (so vocab 49152).

Random bytes are valid K-quant / int4 codes once the scales are set: each linear's weights get a second moment of
1 / fan_in, so a layer's output has roughly unit variance and the activations stay finite through every layer
(`check_gguf` dequantizes with gguf-py to confirm). Files are written one tensor at a time (no model-sized buffer).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

QK_K = 256
Q4_K_BYTES, Q6_K_BYTES = 144, 210  # per 256-weight block: d, dmin, 12 scale bytes, 128 nibble bytes / ql, qh, sc, d
GROUP = 128  # AWQ / GPTQ group size
WRITER = 2  # bump when the files written change: a stamp of another version rewrites them


@dataclass(frozen=True)
class Geometry:
    layers: int = 32
    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    ffn: int = 14336
    vocab: int = 49152  # SmolLM2's tokenizer; Mistral-7B's 32000 would need a truncated BPE vocabulary and merges
    context: int = 32768
    rms_eps: float = 1e-5
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def linears(self) -> list[tuple[str, str, int, int]]:
        """(GGUF name, HF module, out, in) of one layer's linears."""
        kv = self.kv_heads * self.head_dim
        return [("attn_q", "self_attn.q_proj", self.hidden, self.hidden),
                ("attn_k", "self_attn.k_proj", kv, self.hidden), ("attn_v", "self_attn.v_proj", kv, self.hidden),
                ("attn_output", "self_attn.o_proj", self.hidden, self.hidden),
                ("ffn_gate", "mlp.gate_proj", self.ffn, self.hidden), ("ffn_up", "mlp.up_proj", self.ffn, self.hidden),
                ("ffn_down", "mlp.down_proj", self.hidden, self.ffn)]


def use_more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's Q4_K_M rule for the layers whose attn_v and ffn_down get Q6_K."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


# ---- GGUF -------------------------------------------------------------------------------------------------------

def q4_k_blocks(rng: np.random.Generator, rows: int, cols: int, second_moment: float) -> np.ndarray:
    """Random Q4_K rows: 6-bit scales and mins held to 0..15, dmin = 7.5 d so each row is centred near 0;
    then E[w^2] = 4037 d^2 (sc, m, q uniform), and d is set for the wanted second moment."""
    blocks = np.frombuffer(rng.bytes(rows * cols // QK_K * Q4_K_BYTES), np.uint8).reshape(-1, Q4_K_BYTES).copy()
    d = np.float16(np.sqrt(second_moment / 4037.0))
    blocks[:, 0:2] = np.frombuffer(d.tobytes(), np.uint8)
    blocks[:, 2:4] = np.frombuffer(np.float16(7.5 * float(d)).tobytes(), np.uint8)
    blocks[:, 4:12] &= 0x0F  # scales/mins 0..3 below 16, and no high bits for scales/mins 4..7
    return blocks.reshape(rows, -1)


def q6_k_blocks(rng: np.random.Generator, rows: int, cols: int, second_moment: float) -> np.ndarray:
    """Random Q6_K rows: int8 sub-block scales held to 0..7, so E[w^2] = d^2 * 17.5 * 341.5."""
    blocks = np.frombuffer(rng.bytes(rows * cols // QK_K * Q6_K_BYTES), np.uint8).reshape(-1, Q6_K_BYTES).copy()
    blocks[:, 192:208] &= 0x07
    blocks[:, 208:210] = np.frombuffer(np.float16(np.sqrt(second_moment / (17.5 * 341.5))).tobytes(), np.uint8)
    return blocks.reshape(rows, -1)


def gguf_tensors(g: Geometry) -> list[tuple[str, str, int, int]]:
    """(name, type, rows, cols) in file order; type "Q4_K", "Q6_K" or "F32" (cols only, rows = 1)."""
    out = [("token_embd.weight", "Q4_K", g.vocab, g.hidden)]
    for i in range(g.layers):
        out.append((f"blk.{i}.attn_norm.weight", "F32", 1, g.hidden))
        for name, _, rows, cols in g.linears():
            more = name in ("attn_v", "ffn_down") and use_more_bits(i, g.layers)
            out.append((f"blk.{i}.{name}.weight", "Q6_K" if more else "Q4_K", rows, cols))
        out.append((f"blk.{i}.ffn_norm.weight", "F32", 1, g.hidden))
    return out + [("output_norm.weight", "F32", 1, g.hidden), ("output.weight", "Q6_K", g.vocab, g.hidden)]


def write_gguf(path: Path, g: Geometry, tokenizer_gguf: Path, seed: int = 0) -> None:
    import gguf

    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"random-llama-{g.layers}L-Q4_K_M")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    hparams = {"context_length": g.context, "embedding_length": g.hidden, "block_count": g.layers,
               "feed_forward_length": g.ffn, "head_count": g.heads, "head_count_kv": g.kv_heads,
               "rope_dimension_count": g.head_dim, "rope_freq_base": g.rope_theta, "layer_norm_rms_eps": g.rms_eps,
               "vocab_size": g.vocab}
    for key, value in hparams.items():
        getattr(writer, f"add_{key}")(value)
    for field in gguf.GGUFReader(tokenizer_gguf).fields.values():
        if field.name.startswith("tokenizer."):
            sub = field.types[1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub)
    nbytes = {"Q4_K": Q4_K_BYTES, "Q6_K": Q6_K_BYTES}
    tensors = gguf_tensors(g)
    for name, kind, rows, cols in tensors:
        if kind == "F32":
            writer.add_tensor_info(name, (cols,), np.dtype(np.float32), cols * 4)
        else:
            row_bytes = cols // QK_K * nbytes[kind]
            writer.add_tensor_info(name, (rows, row_bytes), np.dtype(np.uint8), rows * row_bytes,
                                   raw_dtype=gguf.GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, kind, rows, cols in tensors:
        # the embedding's rows are unit variance (RMSNorm follows); a linear's weights 1 / fan_in
        moment = 1.0 if name == "token_embd.weight" else 1.0 / cols
        data = (np.ones(cols, np.float32) if kind == "F32" else
                (q4_k_blocks if kind == "Q4_K" else q6_k_blocks)(rng, rows, cols, moment))
        writer.write_tensor_data(data)
    writer.close()


def check_gguf(path: Path) -> dict[str, float]:
    """gguf-py's dequantization of a few tensors: every value finite, and each linear's E[w^2] * fan_in near 1."""
    import gguf

    reader = gguf.GGUFReader(path)
    picks = [t for t in reader.tensors if t.name.startswith("blk.0.") or t.name == "output.weight"]
    out = {}
    for t in picks:
        w = gguf.quants.dequantize(t.data[:64], t.tensor_type)  # 64 rows are enough for the statistics
        if not np.isfinite(w).all():
            raise ValueError(f"{t.name} dequantizes to non-finite values")
        out[t.name] = float(np.mean(w.astype(np.float64) ** 2) * w.shape[-1]) if w.ndim == 2 else float(w.mean())
    return out


# ---- AWQ / GPTQ safetensors ---------------------------------------------------------------------------------------

def _int32(rng: np.random.Generator, *shape: int):
    import torch

    return torch.frombuffer(bytearray(rng.bytes(int(np.prod(shape)) * 4)), dtype=torch.int32).reshape(shape)


def packed_linear(rng: np.random.Generator, method: str, rows: int, cols: int, g_idx=None) -> dict:
    """One linear's qweight / qzeros / scales (/ g_idx), packed as AutoAWQ GEMM or GPTQ (v1, act-order) pack them.
    Codes and zeros are random nibbles, so (q - z) has variance 42.5; the fp16 scales make E[w^2] = 1 / fan_in."""
    import torch

    groups = cols // GROUP
    scale = (1.0 / np.sqrt(42.5 * cols)) * rng.uniform(0.75, 1.25, (groups, rows))
    tensors = {"scales": torch.from_numpy(scale.astype(np.float16))}
    if method == "awq":
        tensors["qweight"], tensors["qzeros"] = _int32(rng, cols, rows // 8), _int32(rng, groups, rows // 8)
    else:
        tensors["qweight"], tensors["qzeros"] = _int32(rng, cols // 8, rows), _int32(rng, groups, rows // 8)
        tensors["g_idx"] = g_idx.clone()  # safetensors stores no shared storage
    return tensors


def act_order_g_idx(rng: np.random.Generator, cols: int):
    """A random act-order group map: GPTQ orders inputs by the input's Hessian, so layers that read the same
    input (q/k/v, gate/up) share it."""
    import torch

    return torch.from_numpy(rng.permutation(np.arange(cols, dtype=np.int32) // GROUP))


def quant_config(method: str) -> dict:
    if method == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True, "version": "gemm"}
    return {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": True, "sym": False,
            "checkpoint_format": "gptq"}


def hf_config(g: Geometry, method: str, tokenizer) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": g.hidden,
            "intermediate_size": g.ffn, "num_hidden_layers": g.layers, "num_attention_heads": g.heads,
            "num_key_value_heads": g.kv_heads, "head_dim": g.head_dim, "vocab_size": g.vocab,
            "max_position_embeddings": g.context, "rms_norm_eps": g.rms_eps, "rope_theta": g.rope_theta,
            "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "float16",
            "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
            "quantization_config": quant_config(method)}


def write_checkpoint(out: Path, g: Geometry, method: str, tokenizer_gguf: Path, seed: int = 0,
                     layers_per_shard: int = 8) -> None:
    """config.json, the tokenizer, and safetensors shards of `layers_per_shard` layers with an index."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_gguf.parent, gguf_file=tokenizer_gguf.name)
    tokenizer.save_pretrained(out)
    (out / "config.json").write_text(json.dumps(hf_config(g, method, tokenizer), indent=2))
    shards = [list(range(i, min(i + layers_per_shard, g.layers))) for i in range(0, g.layers, layers_per_shard)]
    weight_map = {}
    for n, layers in enumerate(shards):
        tensors = {}
        if n == 0:
            tensors["model.embed_tokens.weight"] = torch.from_numpy(
                rng.standard_normal((g.vocab, g.hidden), np.float32).astype(np.float16))
        for i in layers:
            prefix = f"model.layers.{i}"
            for norm in ("input_layernorm", "post_attention_layernorm"):
                tensors[f"{prefix}.{norm}.weight"] = torch.ones(g.hidden, dtype=torch.float16)
            shared_input = {"attn_k": "attn_q", "attn_v": "attn_q", "ffn_up": "ffn_gate"}
            g_idx: dict = {}
            for name, module, rows, cols in g.linears():
                key = shared_input.get(name, name)
                if method == "gptq" and key not in g_idx:
                    g_idx[key] = act_order_g_idx(rng, cols)
                for part, tensor in packed_linear(rng, method, rows, cols, g_idx.get(key)).items():
                    tensors[f"{prefix}.{module}.{part}"] = tensor
        if n == len(shards) - 1:
            tensors["model.norm.weight"] = torch.ones(g.hidden, dtype=torch.float16)
            head = rng.standard_normal((g.vocab, g.hidden), np.float32) / np.sqrt(g.hidden)
            tensors["lm_head.weight"] = torch.from_numpy(head.astype(np.float16))
        name = f"model-{n + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(tensors, str(out / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
        del tensors
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))


# ---- what is on disk ----------------------------------------------------------------------------------------------

def model_path(root: Path, fmt: str, g: Geometry) -> Path:
    name = f"random-llama-{g.layers}L"
    return root / (f"{name}-Q4_K_M.gguf" if fmt == "gguf" else f"{name}-{fmt}-g{GROUP}")


def ensure_model(root: Path, fmt: str, g: Geometry, tokenizer_gguf: Path) -> Path:
    """The model file (dir) for `fmt`, written unless a finished one with the same geometry is there."""
    path = model_path(root, fmt, g)
    stamp = path.with_name(path.name + ".done.json")
    if stamp.is_file() and json.loads(stamp.read_text()) == asdict(g) | {"writer": WRITER}:
        return path
    root.mkdir(parents=True, exist_ok=True)
    print(f"writing {path} ...", flush=True)
    if fmt == "gguf":
        write_gguf(path, g, tokenizer_gguf)
        print(f"  gguf-py dequantization, E[w^2] * fan_in: {check_gguf(path)}", flush=True)
    else:
        write_checkpoint(path, g, fmt, tokenizer_gguf)
    stamp.write_text(json.dumps(asdict(g) | {"writer": WRITER}))
    return path


def files_of(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]


def decode_bytes(path: Path) -> int:
    """The bytes one decode step streams from the file: every weight but the embedding (one row of it is read)."""
    if path.is_file():
        import gguf

        return sum(int(t.n_bytes) for t in gguf.GGUFReader(path).tensors if t.name != "token_embd.weight")
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
