"""GGUF -> our ModelConfig and HF-named weights: dequantized, or as the layers that run the file's blocks."""

from __future__ import annotations

import re
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from inferplug.errors import ModelSourceError
from inferplug.models.config import ModelConfig
from inferplug.models.gguf import GGML_TYPES, GGUFFile, GGUFTensorInfo

if TYPE_CHECKING:
    import torch

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2")
# llama.cpp permutes Q/K rows of these (convert_hf_to_gguf.py LlamaModel.permute) for its RoPE layout.
_PERMUTED_ARCHITECTURES = ("llama", "mistral")

_TOP_LEVEL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
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
}
CONVERSION_VERSION = 5  # bump when weights_from_gguf's layers change: cached conversions of the old ones then miss
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
# Precomputed RoPE factors (llama3 scaling); our RoPE derives them from config.rope_scaling instead.
_DERIVED_TENSORS = ("rope_freqs.weight",)


def check_architecture(gguf: GGUFFile) -> None:
    if gguf.architecture not in SUPPORTED_ARCHITECTURES:
        raise ModelSourceError(
            f"{gguf.path} holds a {gguf.architecture!r} model; inferplug's native engine runs "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}. Pick a GGUF of a Llama-family model."
        )


def config_from_gguf(gguf: GGUFFile) -> ModelConfig:
    check_architecture(gguf)
    meta = gguf.metadata
    count = lambda key, default=None: _arch_count(gguf, key, default)  # noqa: E731
    hidden, heads = count("embedding_length"), count("attention.head_count")
    embedding = gguf.tensors.get("token_embd.weight")
    vocab = count("vocab_size", embedding.shape[0] if embedding is not None else None)
    head_dim = count("attention.key_length", count("rope.dimension_count", hidden // heads))
    eos = [_token_id(gguf, key) for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id") if key in meta]
    window = gguf.arch_key("attention.sliding_window")
    return ModelConfig(
        architecture=gguf.architecture,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=count("feed_forward_length"),
        num_hidden_layers=count("block_count"),
        num_attention_heads=heads,
        num_key_value_heads=count("attention.head_count_kv", heads),
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
    )


def _arch_count(gguf: GGUFFile, key: str, default: int | None = None) -> int:
    """An architecture size (layers, heads, widths): a positive integer, or a ModelSourceError naming the key."""
    value = gguf.arch_key(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelSourceError(f"{gguf.path}: {gguf.architecture}.{key} is {str(value)[:40]}, not a positive integer; "
                               "the file is damaged or not a Llama-family model. Re-download it.")
    return value


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
        scaling["original_max_position_embeddings"] = _arch_count(gguf, "rope.scaling.original_context_length")
    return scaling


def hf_name(gguf_name: str) -> str | None:
    """The HF parameter name of a GGUF tensor; None for tensors we derive instead of load."""
    if gguf_name in _TOP_LEVEL_NAMES:
        return _TOP_LEVEL_NAMES[gguf_name]
    if gguf_name in _DERIVED_TENSORS:
        return None
    match = _LAYER_TENSOR.fullmatch(gguf_name)
    if match and match.group(2) in _LAYER_NAMES:
        layer, part, kind = match.groups()
        return f"model.layers.{layer}.{_LAYER_NAMES[part]}.{kind}"
    raise ModelSourceError(
        f"GGUF tensor {gguf_name!r} has no counterpart in a Llama-family model; the file is not a plain "
        "Llama/Mistral/Qwen2 checkpoint (MoE and multimodal GGUFs are not supported)."
    )


def gguf_name(name: str) -> str:
    """The GGUF tensor name of an HF parameter name (hf_name's inverse)."""
    top = {hf: gguf for gguf, hf in _TOP_LEVEL_NAMES.items()}
    if name in top:
        return top[name]
    _, _, layer, rest = name.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    part = next(g for g, hf in _LAYER_NAMES.items() if hf == module)
    return f"blk.{layer}.{part}.{kind}"


def matrix_roles(gguf: GGUFFile) -> tuple[tuple[str, str, int], ...]:
    """Each matrix as (role, ggml type, parameters): role "head" for the lm_head or a tied embedding, "embed" for an
    untied embedding, "layer" for the rest (what weights_from_gguf loads each as)."""
    tied = "output.weight" not in gguf.tensors
    roles = []
    for info in gguf.tensors.values():
        name = hf_name(info.name)
        if name is None or len(info.shape) != 2:
            continue
        role = {"lm_head.weight": "head", "model.embed_tokens.weight": "head" if tied else "embed"}.get(name, "layer")
        roles.append((role, info.type_name, info.shape[0] * info.shape[1]))
    return tuple(roles)


def unpermute_rope_rows(weight: "torch.Tensor", n_head: int) -> "torch.Tensor":
    """Undo llama.cpp's Q/K row permutation: per head, rows are interleaved pairs; HF wants halves."""
    head_dim_half = weight.shape[0] // n_head // 2
    return weight.reshape(n_head, head_dim_half, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


def weights_from_gguf(gguf: GGUFFile, dtype: "torch.dtype", device="cpu",
                      layer_format: str | None = None) -> dict[str, Any]:
    """HF-named weights, read one tensor at a time. `layer_format` ("gguf", "int4" or "int8"; CPU kernels only): each
    quantized matrix comes as the layer that runs it (models/gguf_layers.py), the embedding in its own bits and a head
    (the lm_head, or a tied embedding) as Q8_0 on float activations; float tensors in `dtype`. None: every tensor
    dequantized to `dtype` (CTranslate2's converter, tensor parallel, CUDA)."""
    from tqdm import tqdm

    from inferplug.models.gguf_layers import gguf_layer, is_quantized

    config = config_from_gguf(gguf)
    head_counts = {".q_proj.": config.num_attention_heads, ".k_proj.": config.num_key_value_heads}
    if gguf.architecture not in _PERMUTED_ARCHITECTURES:
        head_counts = {}
    head_names = {"lm_head.weight", *(["model.embed_tokens.weight"] if config.tie_word_embeddings else [])}
    infos = [info for info in gguf.tensors.values() if hf_name(info.name) is not None]
    weights = {}
    with one_intra_op_thread(), open(gguf.path, "rb") as handle, \
            tqdm(total=sum(i.nbytes for i in infos), unit="B", unit_scale=True, desc="loading GGUF", disable=None) as bar:
        for info in infos:
            name = hf_name(info.name)
            as_layer = layer_format is not None and is_quantized(info.type_name) and len(info.shape) == 2
            # whole rows of blocks for a layer: the Q/K row order is undone on their bytes
            tensor = gguf.read_tensor(handle, info).view(info.shape[0], -1) if as_layer else dequantize_tensor(gguf, handle, info)
            for marker, n_head in head_counts.items():
                if marker in name:
                    tensor = unpermute_rope_rows(tensor, n_head)
            if as_layer:
                bits = "gguf" if name == "model.embed_tokens.weight" else layer_format  # an embedding stays as stored
                weights[name] = gguf_layer(tensor, info.type_name, info.shape, bits, head=name in head_names)
            else:
                weights[name] = tensor.to(device=device, dtype=dtype).contiguous()
            bar.update(info.nbytes)
            release_freed_heap()  # each tensor's temporaries: the peak stays the weights so far plus one tensor's
    return weights


def release_freed_heap() -> None:
    """Hand the heap a tensor's temporaries left back to the OS (glibc keeps freed chunks: 130 MB on a two-layer
    7B-wide model), so that the process's RSS is the weights, as the memory plan counts them. About 1 ms a call."""
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim this way
        pass


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
