"""GGUF -> our ModelConfig and HF-named weights: dequantized, or as the layers that run the file's blocks.

Names and values come out as HF's: a family's own tensor names (models/family.py gguf_layer_names), an MoE's 3-D
expert tensors cut into HF's per-expert ones (each a view of the file's blocks, no float copy), Gemma's norms
back from w + 1 to w, and llama.cpp's interleaved Q/K rows back to HF's halves."""

from __future__ import annotations

import math
import re
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from inferplug.errors import ModelSourceError
from inferplug.models.config import ModelConfig
from inferplug.models.gguf import GGML_TYPES, GGUFFile, GGUFTensorInfo

if TYPE_CHECKING:
    import torch

_TOP_LEVEL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "per_layer_token_embd.weight": "model.embed_tokens_per_layer.weight",  # Gemma 4's per-layer inputs
    "per_layer_model_proj.weight": "model.per_layer_model_projection.weight",
    "per_layer_proj_norm.weight": "model.per_layer_projection_norm.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm",  # QK-norm (Qwen3, Gemma 3)
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate_inp": "mlp.gate",  # an MoE layer's router
}
# an MoE layer's experts, one 3-D tensor each (experts, out, in) -> HF's per-expert module
_EXPERT_NAMES = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj",
                 "ffn_gate_up_exps": "gate_up_proj"}  # Gemma 4's gate and up in one: cut in two for float weights
CONVERSION_VERSION = 9  # bump when weights_from_gguf's layers change: cached conversions of the old ones then miss
_BARE_PARAMETERS = ("self_attn.sinks",)  # HF parameters, not modules: no ".weight" in their names (gpt-oss's sinks)
EMBEDDINGS = ("model.embed_tokens.weight", "model.embed_tokens_per_layer.weight")  # looked up by row, not multiplied
# scale: Gemma 4's router and experts; no suffix: a bare parameter (Qwen3.5's ssm_a)
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+?)(?:\.(weight|bias|scale))?")
# Precomputed RoPE factors (llama3 scaling); our RoPE derives them from config.rope_scaling instead.
_DERIVED_TENSORS = ("rope_freqs.weight",)


def config_from_gguf(gguf: GGUFFile) -> ModelConfig:
    from inferplug.models.registry import gguf_family

    family = gguf_family(gguf.architecture, gguf.path)
    meta = gguf.metadata
    count = lambda key, default=None: gguf.arch_count(key, default)  # noqa: E731
    hidden, heads = count("embedding_length"), count("attention.head_count")
    embedding = gguf.tensors.get("token_embd.weight")
    vocab = count("vocab_size", embedding.shape[0] if embedding is not None else None)
    head_dim = count("attention.key_length", count("rope.dimension_count", hidden // heads))
    eos = [_token_id(gguf, key) for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id") if key in meta]
    ids = {token: i for i, token in enumerate(meta.get("tokenizer.ggml.tokens", ())) if token in family.end_tokens}
    eos += [ids[token] for token in family.end_tokens if token in ids]
    window = gguf.arch_key("attention.sliding_window")
    # per layer where they differ (Gemma 4: its family reads them)
    kv_heads, ffn = gguf.arch_key("attention.head_count_kv"), gguf.arch_key("feed_forward_length")
    fields = dict(
        architecture=gguf.architecture,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=ffn[0] if isinstance(ffn, list) else count("feed_forward_length"),
        num_hidden_layers=count("block_count"),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads[0] if isinstance(kv_heads, list) else count("attention.head_count_kv", heads),
        head_dim=head_dim,
        max_position_embeddings=count("context_length", 2048),
        rms_norm_eps=_arch_number(gguf, "attention.layer_norm_rms_epsilon", 1e-6),
        rope_theta=_arch_number(gguf, "rope.freq_base", 10000.0),
        rope_scaling=_rope_scaling(gguf),
        tie_word_embeddings="output.weight" not in gguf.tensors,
        attention_bias="blk.0.attn_q.bias" in gguf.tensors,
        sliding_window=None if window is None else count("attention.sliding_window"),
        bos_token_id=_token_id(gguf, "tokenizer.ggml.bos_token_id") if "tokenizer.ggml.bos_token_id" in meta else None,
        eos_token_ids=list(dict.fromkeys(eos)),
        family=family.name,
    )
    return ModelConfig(**{**fields, **(family.gguf_fields(gguf) if family.gguf_fields else {})})


def _arch_number(gguf: GGUFFile, key: str, default: float) -> float:
    value = gguf.arch_key(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ModelSourceError(f"{gguf.path}: {gguf.architecture}.{key} is {str(value)[:40]}, not a positive number; "
                               "re-download the file.")
    return float(value)


def _token_id(gguf: GGUFFile, key: str) -> int:
    value = gguf.metadata[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ModelSourceError(f"{gguf.path}: {key} is {str(value)[:40]}, not a token id; re-download the file.")
    return value


def _rope_scaling(gguf: GGUFFile) -> dict | None:
    kind = gguf.arch_key("rope.scaling.type")
    if kind in (None, "none"):
        return None
    if not isinstance(kind, str):
        raise ModelSourceError(f"{gguf.path}: {gguf.architecture}.rope.scaling.type is {str(kind)[:40]}, not a name; "
                               "re-download the file.")
    scaling = {"rope_type": kind, "factor": _arch_number(gguf, "rope.scaling.factor", 1.0)}
    if gguf.arch_key("rope.scaling.original_context_length"):
        scaling["original_max_position_embeddings"] = gguf.arch_count("rope.scaling.original_context_length")
    return scaling


def hf_name(gguf_name: str, family=None) -> str | None:
    """The HF parameter name of a GGUF tensor in `family` (models/family.py; None: Llama's names); None for tensors
    we derive instead of load. An MoE's 3-D expert tensor names all its experts: "...mlp.experts.gate_proj.weight"
    (expert_names gives each one's)."""
    if gguf_name in _TOP_LEVEL_NAMES:
        return _TOP_LEVEL_NAMES[gguf_name]
    if gguf_name in _DERIVED_TENSORS:
        return None
    match = _LAYER_TENSOR.fullmatch(gguf_name)
    names = {**_LAYER_NAMES, **(family.gguf_layer_names if family else {})}
    if match and match.group(2) in names:
        layer, part, kind = match.groups()
        name = f"model.layers.{layer}.{names[part]}" + (f".{kind}" if kind else "")
        return name.removesuffix(".weight") if names[part] in _BARE_PARAMETERS else name
    if match and match.group(2) in _EXPERT_NAMES:
        layer, part, kind = match.groups()
        return f"model.layers.{layer}.mlp.experts.{_EXPERT_NAMES[part]}.{kind}"
    family_name = family.name if family else "llama"
    raise ModelSourceError(
        f"GGUF tensor {gguf_name!r} has no counterpart in a {family_name} model; the file is not a plain "
        f"{family_name} checkpoint (multimodal GGUFs are not supported: use the text model's file)."
    )


def expert_names(name: str, experts: int) -> list[str]:
    """HF's per-expert names of a 3-D expert tensor's hf_name."""
    head, tail = name.split(".experts.")
    return [f"{head}.experts.{e}.{tail}" for e in range(experts)]


def gguf_name(name: str, family=None) -> str:
    """The GGUF tensor name of an HF parameter name in `family` (hf_name's inverse)."""
    top = {hf: gguf for gguf, hf in _TOP_LEVEL_NAMES.items()}
    if name in top:
        return top[name]
    _, _, layer, rest = name.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    if module.startswith("mlp.experts."):  # one expert's: its 3-D tensor's name
        part = next(g for g, hf in _EXPERT_NAMES.items() if module.endswith(hf))
    else:
        names = {**_LAYER_NAMES, **(family.gguf_layer_names if family else {})}
        part = next(g for g, hf in names.items() if hf == module)
    return f"blk.{layer}.{part}.{kind}"


def matrix_roles(gguf: GGUFFile) -> tuple[tuple[str, str, int], ...]:
    """Each matrix as (role, ggml type, parameters): role "head" for the lm_head or a tied embedding, "embed" for an
    untied embedding, "layer" for the rest (what weights_from_gguf loads each as)."""
    from inferplug.models.registry import gguf_family

    family = gguf_family(gguf.architecture, gguf.path)
    tied = "output.weight" not in gguf.tensors
    roles = []
    for info in gguf.tensors.values():
        name = hf_name(info.name, family)
        if name is None or len(info.shape) < 2 or name.endswith(".bias"):  # an MoE's expert biases are 2-D
            continue
        role = {"lm_head.weight": "head", "model.embed_tokens.weight": "head" if tied else "embed",
                "model.embed_tokens_per_layer.weight": "embed"}.get(name, "layer")
        roles.append((role, info.type_name, math.prod(info.shape)))  # an MoE's experts: all of them, as mapped
    return tuple(roles)


def unpermute_rope_rows(weight: "torch.Tensor", n_head: int) -> "torch.Tensor":
    """Undo llama.cpp's Q/K row permutation: per head, rows are interleaved pairs; HF wants halves."""
    head_dim_half = weight.shape[0] // n_head // 2
    return weight.reshape(n_head, head_dim_half, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


def weights_from_gguf(gguf: GGUFFile, dtype: "torch.dtype", device="cpu",
                      layer_format: str | None = None) -> dict[str, Any]:
    """HF-named weights, read one tensor at a time. `layer_format` ("gguf", "int4" or "int8"; CPU kernels only): each
    quantized matrix comes as the layer that runs it (models/gguf_layers.py), the embedding in its own bits and a head
    (the lm_head, or a tied embedding) as a head layer (Q6_K or Q8_0, x in two int8 parts); float tensors in `dtype`.
    "mxfp4" (one GPU): the MXFP4 matrices alone as layers where the CPU kernels build (MXFP4Linear binds their ops;
    the Triton grouped GEMM reads its blocks), the rest dequantized. None: every tensor dequantized to `dtype`
    (CTranslate2's converter, tensor parallel)."""
    from tqdm import tqdm

    from inferplug.kernels import cpu as cpu_kernels
    from inferplug.models.gguf_layers import gguf_layer, is_quantized
    from inferplug.models.heap import HeapBound

    from inferplug.models.registry import gguf_family, gguf_interleaved_rope

    config = config_from_gguf(gguf)
    family = gguf_family(gguf.architecture, gguf.path)
    head_counts = {".q_proj.": config.num_attention_heads, ".k_proj.": config.num_key_value_heads}
    if not gguf_interleaved_rope(gguf.architecture):
        head_counts = {}
    head_names = {"lm_head.weight", *(["model.embed_tokens.weight"] if config.tie_word_embeddings else [])}
    infos = [info for info in gguf.tensors.values() if hf_name(info.name, family) is not None]
    weights, kept, bound = {}, 0, HeapBound()
    with one_intra_op_thread(), open(gguf.path, "rb") as handle, \
            tqdm(total=sum(i.nbytes for i in infos), unit="B", unit_scale=True, desc="loading GGUF", disable=None) as bar:
        for info in infos:
            name = hf_name(info.name, family)
            as_layer = layer_format is not None and is_quantized(info.type_name) and len(info.shape) >= 2 and \
                (layer_format != "mxfp4" or info.type_name == "MXFP4" and cpu_kernels.runs_on("cpu"))
            # whole rows of blocks for a layer: the Q/K row order is undone on their bytes
            tensor = gguf.read_tensor(handle, info).view(*info.shape[:-1], -1) if as_layer else \
                dequantize_tensor(gguf, handle, info)
            for marker, n_head in head_counts.items():
                if marker in name:
                    tensor = unpermute_rope_rows(tensor, n_head)
            if family.norms_plus_one and name.endswith("norm.weight") and \
                    not name.removesuffix(".weight").endswith(family.plain_norms):  # llama.cpp stores them as w + 1
                tensor = tensor - 1
            parts = {name: tensor}
            if ".experts." in name:  # an MoE's experts: each its own matrix (or bias), a view of the file's rows
                parts = dict(zip(expert_names(name, info.shape[0]), tensor.unbind(0)))
            if ".gate_up_proj." in name and not as_layer:  # gate rows, then up rows; block layers stay as one
                parts = {part.replace(".gate_up_proj.", f".{proj}."): half for part, both in parts.items()
                         for proj, half in zip(("gate_proj", "up_proj"), both.chunk(2))}
            for part_name, part in parts.items():
                if as_layer:
                    bits = "gguf" if part_name in EMBEDDINGS or layer_format == "mxfp4" else layer_format  # as stored
                    weights[part_name] = gguf_layer(part, info.type_name, (part.shape[0], info.shape[-1]), bits,
                                                    head=part_name in head_names)
                else:
                    weights[part_name] = part.to(device=device, dtype=dtype).contiguous()
                kept += _nbytes(weights[part_name])
                bound.check(kept + info.nbytes)  # the peak stays the weights so far plus this tensor's bytes
            bar.update(info.nbytes)
    if layer_format is not None:
        _fuse_gate_up(weights, bound, kept)
    return weights


def _fuse_gate_up(weights: dict[str, Any], bound, kept: int) -> None:
    """Each gated MLP's (and each expert's) gate and up block layers as one `gate_up_proj`, the layer the model runs
    (models/moe.py gate_up_taker): fused once here, so the conversion cache holds it and a warm load maps it instead
    of copying gate and up (5.2 GB of a 24-layer Qwen3-30B-A3B's experts, 2 GB of Qwen3-8B's MLPs)."""
    from inferplug.models.moe import gate_up_taker

    take_gate_up = gate_up_taker(weights.pop, weights.__contains__)
    for gate in [name for name in weights if name.endswith(".gate_proj.weight")]:
        prefix = gate.removesuffix("gate_proj.weight")
        if f"{prefix}up_proj.weight" in weights:
            weights[f"{prefix}gate_up_proj.weight"] = take_gate_up(prefix)
            bound.check(kept)  # a layer's parts go once its last expert is fused: their pages back to the OS


def _nbytes(weight: Any) -> int:
    return weight.nbytes() if callable(weight.nbytes) else weight.nbytes  # a layer's buffers, or a tensor's


def dequantize_tensor(gguf: GGUFFile, handle, info: GGUFTensorInfo) -> "torch.Tensor":
    """One tensor's values (float32, or its own float type), in the file's (llama.cpp) layout."""
    from inferplug.models.gguf_dequant import dequantize

    return dequantize(gguf.read_tensor(handle, info), info.type_name, info.shape, GGML_TYPES[info.type_name][2])


@contextmanager
def one_intra_op_thread():
    """Dequantize on one torch thread: these are short elementwise ops, and on our shared 2-core CPU
    the thread hand-offs cost more than the work (SmolLM2, same load: 24 s on 2 threads, 2.2 s on 1)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
