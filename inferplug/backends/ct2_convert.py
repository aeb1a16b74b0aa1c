"""Convert a model to CTranslate2's format once, and cache the result.

An HF dir goes straight to CTranslate2's TransformersConverter. A GGUF file is first
written out as an HF dir (config.json + safetensors + tokenizer) through our own loader,
since CTranslate2 cannot read GGUF. The converted model lives under
INFERPLUG_HOME/ctranslate2/<source checksum>-<quantization>/ and is reused while the
source is unchanged. The tokenizer is saved beside it, so a cached model needs nothing else.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

from inferplug.errors import ModelSourceError
from inferplug.models.config import ModelConfig

# the GGUF architectures write_hf_dir writes as an HF dir: ct2_compute.GGUF_FAMILIES' (the resolver refuses others)
_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
_DONE_MARKER = "inferplug-converted.json"


def converted_model_dir(source: Path, quantization: str) -> Path:
    """The CTranslate2 model for `source` at `quantization`, converting it on first use."""
    from inferplug.sources import _locked, home

    target = home() / "ctranslate2" / f"{source_checksum(source)[:16]}-{quantization}"
    with _locked(target.parent / f"{target.name}.lock"):
        if (target / _DONE_MARKER).is_file():
            return target
        _convert(source, target, quantization)
    return target


def source_checksum(source: Path) -> str:
    """sha256 of a GGUF file (the recorded one when sources.py pulled it), or of an HF dir's
    config plus the names, sizes and mtimes of its files (hashing gigabytes of shards on each
    start would cost more than it protects against)."""
    from inferplug.models.loader import gguf_file_of
    from inferplug.sources import read_record, sha256_of

    gguf = gguf_file_of(source)
    if gguf is not None:
        record = read_record(gguf)
        st = gguf.stat()
        if record and (record.get("size"), record.get("mtime_ns")) == (st.st_size, st.st_mtime_ns):
            return record["sha256"]
        return sha256_of(gguf)
    digest = hashlib.sha256((source / "config.json").read_bytes())
    for f in sorted(source.iterdir()):
        if f.is_file():
            st = f.stat()
            digest.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return digest.hexdigest()


def _convert(source: Path, target: Path, quantization: str) -> None:
    from ctranslate2.converters import TransformersConverter

    from inferplug.models.loader import gguf_file_of, load_tokenizer

    if target.exists():
        shutil.rmtree(target)  # a half-written conversion from a killed run
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="inferplug-ct2-") as tmp:
        hf_dir = source
        if gguf_file_of(source) is not None:
            hf_dir = Path(tmp) / "hf"
            write_hf_dir(source, hf_dir)
        print(f"inferplug: converting {source.name} to CTranslate2 ({quantization}), once; cached in {target}")
        try:
            TransformersConverter(str(hf_dir), low_cpu_mem_usage=True).convert(
                str(target), quantization=quantization, force=True
            )
        except (ValueError, NotImplementedError, OSError) as exc:
            shutil.rmtree(target, ignore_errors=True)
            raise ModelSourceError(
                f"CTranslate2 cannot convert {source}: {exc}. Use the native backend for this model."
            ) from exc
        load_tokenizer(hf_dir).save_pretrained(target / "tokenizer")
    _fill_null_special_tokens(target / "config.json")
    (target / _DONE_MARKER).write_text(json.dumps({"source": str(source), "quantization": quantization}))


def _fill_null_special_tokens(config_path: Path) -> None:
    """Some converters write `"unk_token": null` for tokenizers without one, which the
    CTranslate2 loader rejects; the Llama converter writes "" for the same case, so do that."""
    config = json.loads(config_path.read_text())
    fixed = {k: ("" if v is None and k.endswith("_token") else v) for k, v in config.items()}
    if fixed != config:
        config_path.write_text(json.dumps(fixed, indent=2))


def write_hf_dir(gguf_source: Path, out: Path) -> None:
    """A GGUF model as an HF dir (float32 safetensors, config.json, tokenizer), via our loader."""
    import torch
    from safetensors.torch import save_file
    from tqdm import tqdm

    from inferplug.models.loader import load_tokenizer, load_weights, read_config

    out.mkdir(parents=True)
    config = read_config(gguf_source)
    (out / "config.json").write_text(json.dumps(hf_config_dict(config), indent=2))
    weights = load_weights(gguf_source, torch.float32)
    if config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    weights = {name: t.contiguous() for name, t in tqdm(weights.items(), desc="dequantizing GGUF", unit="tensor")}
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    load_tokenizer(gguf_source).save_pretrained(out)


def hf_config_dict(config: ModelConfig) -> dict:
    """The config.json transformers expects for this architecture."""
    raw = {
        "architectures": [_ARCHITECTURES[config.architecture]],
        "model_type": config.architecture,
        "hidden_act": "silu",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": config.rope_scaling,
        "tie_word_embeddings": config.tie_word_embeddings,
        "sliding_window": config.sliding_window,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_ids[0] if len(config.eos_token_ids) == 1 else config.eos_token_ids or None,
        "torch_dtype": "float32",
    }
    if config.architecture == "llama":
        raw["attention_bias"] = config.attention_bias
    return raw
