"""Load a model of any family in models/registry.py from an HF dir (safetensors, sharded too) or a GGUF file.

    read_config(path)                -> ModelConfig (header only: cheap, for memory planning)
    load_weights(path, dtype, device) -> {HF parameter name: tensor in dtype (or a narrower float it is stored in)}
    load_tokenizer(path, override)    -> transformers.PreTrainedTokenizerFast with its chat template

`path` is an HF model dir, a .gguf file, or a dir holding exactly one .gguf file.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferplug.errors import ModelSourceError
from inferplug.models.config import ModelConfig

if TYPE_CHECKING:
    import torch

def gguf_file_of(path: Path) -> Path | None:
    """The GGUF file `path` points at (itself, or the only .gguf in a dir without config.json)."""
    path = Path(path)
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelSourceError(f"{path} is a file but not a .gguf; point the profile at its model dir instead.")
        return path
    if not path.is_dir():
        raise ModelSourceError(f"model path {path} does not exist. Point the profile at a GGUF file or an HF model dir.")
    if (path / "config.json").is_file():
        return None
    found = sorted(path.glob("*.gguf"))
    if len(found) > 1:
        names = ", ".join(f.name for f in found)
        raise ModelSourceError(f"{path} holds several GGUF files ({names}); point the profile at one of them.")
    if not found:
        raise ModelSourceError(f"{path} has neither config.json nor a .gguf file, so it is not a model dir.")
    return found[0]


def read_config(path: Path) -> ModelConfig:
    gguf_path = gguf_file_of(path)
    if gguf_path is not None:
        from inferplug.models.gguf import read_gguf
        from inferplug.models.gguf_convert import config_from_gguf

        return config_from_gguf(read_gguf(gguf_path))
    try:
        config = config_from_hf(_read_json(Path(path) / "config.json"))
    except KeyError as exc:  # a field every config of its family has
        raise ModelSourceError(f"{Path(path) / 'config.json'} lacks {exc.args[0]!r}: use the checkpoint's whole "
                               "config.json, as its model card ships it") from None
    generation = Path(path) / "generation_config.json"  # where HF lists every token that ends a reply
    ends = _token_ids(_read_json(generation).get("eos_token_id")) if generation.is_file() else []
    return dataclasses.replace(config, eos_token_ids=list(dict.fromkeys([*config.eos_token_ids, *ends])))


def gguf_matrices(path: Path) -> tuple[tuple[str, str, int], ...]:
    """A GGUF's matrices as (role, ggml type, parameters) for the memory plan; () for an HF dir."""
    gguf_path = gguf_file_of(path)
    if gguf_path is None:
        return ()
    from inferplug.models.gguf import read_gguf
    from inferplug.models.gguf_convert import matrix_roles

    return matrix_roles(read_gguf(gguf_path))


def load_weights(path: Path, dtype: "torch.dtype", device: str = "cpu",
                 declared_format: str | None = None, gguf_layers: str | None = None,
                 load_format: str = "auto") -> dict[str, Any]:
    """`declared_format`: the profile's quantization.format, checked against an HF dir's quantization_config.
    An AWQ / GPTQ checkpoint's quantized linears come as layers (quant/checkpoint_layers.py), not tensors, and so do
    a GGUF's where `gguf_layers` names their block format (models/gguf_convert.weights_from_gguf).
    `load_format` "dummy": random weights at the model's geometry in `declared_format` (models/dummy_weights.py)."""
    if load_format == "dummy":
        from inferplug.kernels import cpu as cpu_kernels
        from inferplug.models.dummy_weights import dummy_weights

        on_kernels = cpu_kernels.runs_on(device)
        return dummy_weights(read_config(path), declared_format or "none", dtype, device, on_kernels)
    gguf_path = gguf_file_of(path)
    if gguf_path is not None:
        from inferplug.models.gguf import read_gguf
        from inferplug.models.gguf_convert import CONVERSION_VERSION, weights_from_gguf

        convert = lambda: weights_from_gguf(read_gguf(gguf_path), dtype, device, gguf_layers)  # noqa: E731
        if gguf_layers in (None, "mxfp4"):  # dequantized floats: the read is the cost, nothing to save
            return convert()
        from inferplug.models.conversion_cache import cached_weights, file_identity

        return cached_weights(["gguf", CONVERSION_VERSION, gguf_layers, dtype, file_identity(gguf_path)], convert)
    from inferplug.models.quant_checkpoint import check_profile_format, read_quant_spec

    config = read_config(path)  # rejects unsupported architectures before reading gigabytes
    spec = read_quant_spec(Path(path))
    if declared_format is not None:
        check_profile_format(declared_format, spec, Path(path))
    weights = _load_safetensors(Path(path), spec, dtype, device)
    from inferplug.models.registry import family

    reshape = family(config.family).hf_weights
    return reshape(weights, config.num_experts) if reshape else weights


def load_tokenizer(path: Path, override: str | None = None):
    """The model's tokenizer; `override` (an HF tokenizer dir or repo id) replaces the bundled one."""
    source = override
    if source is None:
        gguf_path = gguf_file_of(path)
        if gguf_path is not None:
            from inferplug.models.gguf import read_gguf
            from inferplug.models.gguf_tokenizer import tokenizer_from_gguf

            return tokenizer_from_gguf(read_gguf(gguf_path))
        source = str(path)
    from transformers import AutoTokenizer  # here: its import alone took 1.4 s of a GGUF's load

    try:
        return AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as exc:
        raise ModelSourceError(
            f"cannot load a tokenizer from {source}: {exc}. Set the profile's tokenizer to an HF tokenizer dir."
        ) from exc


def config_from_hf(raw: dict[str, Any]) -> ModelConfig:
    """ModelConfig from an HF config.json dict (transformers 4.x and 5.x spellings)."""
    from inferplug.models.registry import hf_family

    if isinstance(raw.get("text_config"), dict):  # a multimodal checkpoint (Qwen3.5, Gemma 4): its language model's
        raw = {**{k: raw[k] for k in ("bos_token_id", "eos_token_id", "tie_word_embeddings") if k in raw},
               **raw["text_config"]}
    model_type = raw.get("model_type")
    family = hf_family(model_type)
    rope = raw.get("rope_parameters") or {}  # transformers 5 folds theta and scaling in here
    if "full_attention" in rope:  # per layer kind (Gemma 3): the full layers' is the model's, the family reads the rest
        rope = rope["full_attention"]
    scaling = raw.get("rope_scaling") or ({k: v for k, v in rope.items() if k != "rope_theta"} if rope else None)
    if scaling and scaling.get("rope_type", scaling.get("type")) == "default":
        scaling = None
    heads = raw["num_attention_heads"]
    eos = raw.get("eos_token_id")
    use_window = raw.get("use_sliding_window", model_type == "mistral")  # Qwen2 ships a window it does not use
    fields = dict(
        architecture=model_type,
        vocab_size=raw["vocab_size"],
        hidden_size=raw["hidden_size"],
        intermediate_size=raw.get("intermediate_size", 0),  # none in an MoE-only config (Qwen3.5-MoE)
        num_hidden_layers=raw["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=raw.get("num_key_value_heads") or heads,
        head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
        max_position_embeddings=raw.get("max_position_embeddings", 2048),
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        rope_theta=raw.get("rope_theta", rope.get("rope_theta", 10000.0)),
        rope_scaling=scaling,
        tie_word_embeddings=raw.get("tie_word_embeddings", False),
        attention_bias=model_type == "qwen2" or bool(raw.get("attention_bias", False)),
        sliding_window=raw.get("sliding_window") if use_window else None,
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=_token_ids(eos),
        family=family.name,
    )
    return ModelConfig(**{**fields, **(family.hf_fields(raw) if family.hf_fields else {})})


def _token_ids(value: int | list[int] | None) -> list[int]:
    """An HF config's eos_token_id (one id, a list, or none) as a list."""
    return [] if value is None else [value] if isinstance(value, int) else list(value)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ModelSourceError(f"{path} is missing; an HF model dir needs config.json next to its weights.")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelSourceError(f"{path} is not valid JSON ({exc}); re-download the model.") from exc


def _load_safetensors(model_dir: Path, spec, dtype: "torch.dtype", device: str) -> dict[str, Any]:
    """Every tensor in `dtype` on `device`, read one at a time; an AWQ / GPTQ checkpoint's quantized linears as
    layers, converted once and mapped from the conversion cache after that (on the CPU, where they are repacked)."""
    from inferplug.models.safetensors_reader import safetensors_files

    files = safetensors_files(model_dir)
    if spec is None or device != "cpu" or spec.method == "mxfp4":  # MXFP4: the family repacks its experts
        return _read_and_convert(files, spec, dtype, device)
    from inferplug.kernels import cpu as cpu_kernels
    from inferplug.models.conversion_cache import cached_weights, file_identity
    from inferplug.models.quant_checkpoint import CONVERSION_VERSION

    layers = "cpu-kernels" if cpu_kernels.runs_on(device) else "torch"  # Q4_1 blocks, or the checkpoint's groups
    key = ["safetensors", CONVERSION_VERSION, spec, dtype, layers,
           *(file_identity(f) for f in (model_dir / "config.json", *files))]
    return cached_weights(key, lambda: _read_and_convert(files, spec, dtype, device))


def _read_and_convert(files: list[Path], spec, dtype: "torch.dtype", device: str) -> dict[str, Any]:
    """One tensor (one quantized module) in memory at a time besides what is already converted. On one torch thread,
    as GGUF's dequantization: at 7B on the shared 2-core host, 62 s against 209 s on two."""
    from tqdm import tqdm

    from inferplug.models.gguf_convert import one_intra_op_thread
    from inferplug.models.quant_checkpoint import quantized_layers
    from inferplug.models.safetensors_reader import SafetensorsTensors

    with one_intra_op_thread(), tqdm(desc="loading weights", unit=" tensors", disable=None, leave=False) as bar:
        tensors = SafetensorsTensors(files, on_read=lambda _: bar.update())
        bar.reset(total=len(tensors))
        layers = quantized_layers(tensors, spec, device, dtype) if spec else {}
        converted = {name: _in_dtype(tensors.pop(name), dtype, device) for name in tensors}
    return {**converted, **layers}


def _in_dtype(tensor: "torch.Tensor", dtype: "torch.dtype", device: str) -> "torch.Tensor":
    """A float tensor in `dtype`, unless that would widen it: a bf16 checkpoint's weights stay bf16 until the model
    takes each one (into dtype, then its layer), so a 7B one is never whole in fp32 (27 GB)."""
    keep = tensor.is_floating_point() and tensor.element_size() < dtype.itemsize
    return tensor.to(device=device, dtype=tensor.dtype if keep else dtype)
