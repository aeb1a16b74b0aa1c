"""AWQ / GPTQ safetensors checkpoints as AutoAWQ and GPTQModel write them: the quantization config, and each
quantized linear's qweight / qzeros / scales (/ g_idx) turned into a layer (quant/checkpoint_layers.py).

    read_quant_spec(model_dir)  -> QuantSpec | None (config.json's quantization_config, or quantize_config.json)
    quantized_layers(tensors, spec, device, dtype) -> {"<module>.weight": layer}, the module's packed tensors consumed

`tensors` is a dict or the loader's lazy SafetensorsTensors (models/safetensors_reader.py), whose `pop` reads one
tensor from the file: modules are converted one at a time, each one's packed tensors dropped once it is a layer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferplug.errors import ProfileError

if TYPE_CHECKING:
    from collections.abc import MutableMapping

    import torch

GROUP_SIZES = (32, 64, 128)
BITS = {"awq": (4,), "gptq": (4, 8)}  # GPTQ's 8 bits: symmetric, on the CPU kernels (quant/checkpoint_layers.py)
PACKED = ("qweight", "qzeros", "scales")
CONVERSION_VERSION = 3  # a key part of the conversion cache's entries: bump it when a layer's conversion changes


@dataclass(frozen=True)
class QuantSpec:
    method: str  # "awq" | "gptq" | "mxfp4" (its experts only: the profile's format speaks for the rest)
    group_size: int
    zero_offset: int = 0  # GPTQ v1 stores z - 1
    bits: int = 4

    @property
    def label(self) -> str:
        return self.method.upper()


def read_quant_spec(model_dir: Path) -> QuantSpec | None:
    """The checkpoint's int4 format; ProfileError for a setting the native engine cannot run."""
    raw = _quant_config(Path(model_dir))
    if raw is None:
        return None
    method = str(raw.get("quant_method", "gptq")).lower()
    if method == "mxfp4":  # gpt-oss's release: its experts MXFP4 (models/mxfp4_checkpoint.py), the rest float
        return QuantSpec("mxfp4", 32)
    if method not in ("awq", "gptq"):
        raise ProfileError(f"{model_dir} is quantized with {method!r}; the native engine reads AWQ and GPTQ int4 "
                           "checkpoints only: use an unquantized, GGUF, AWQ or GPTQ model")
    bits, group = raw.get("bits", raw.get("w_bit")), raw.get("group_size", raw.get("q_group_size"))
    if bits not in BITS[method]:
        raise ProfileError(f"{model_dir}: {method.upper()} with {bits} bits is not supported; the native engine runs "
                           f"{method.upper()} at {' or '.join(map(str, BITS[method]))} bits: pick the model's 4-bit variant")
    if group not in GROUP_SIZES:
        raise ProfileError(f"{model_dir}: group_size {group} is not supported (the native engine runs "
                           f"{', '.join(map(str, GROUP_SIZES))}); pick a checkpoint quantized with one of those")
    fmt = str(raw.get("checkpoint_format", raw.get("format", raw.get("version", "gemm")))).lower()
    if method == "awq" and fmt not in ("gemm",):
        raise ProfileError(f"{model_dir}: AWQ's {fmt!r} packing is not supported; the native engine reads AWQ's "
                           "GEMM packing (AutoAWQ's default, version = \"gemm\"): re-quantize or pick a GEMM checkpoint")
    return QuantSpec(method, group, zero_offset=1 if method == "gptq" and fmt != "gptq_v2" else 0, bits=bits)


def check_profile_format(declared: str, spec: QuantSpec | None, model_dir: Path) -> None:
    """A profile's quantization.format must agree with what the checkpoint holds."""
    found = spec.method if spec and spec.method != "mxfp4" else "none"  # MXFP4 experts beside float weights
    if declared in ("awq", "gptq", "none") and declared != found:
        raise ProfileError(f"the profile says quantization.format = {declared!r} but {model_dir} holds "
                           f"{'an unquantized' if spec is None else 'a ' + spec.label} checkpoint; set "
                           f"quantization.format = {found!r} or point the profile at the right model")


def quantized_layers(tensors: "MutableMapping[str, torch.Tensor]", spec: QuantSpec, device: str,
                     dtype: "torch.dtype") -> dict[str, Any]:
    """Pop every quantized module's packed tensors from `tensors`; return its layer under "<module>.weight". MXFP4
    experts: models/mxfp4_checkpoint.py's pairs (kept where MXFP4Linear can be built: the CPU kernels run it, and on
    CUDA the Triton grouped GEMM reads its blocks; else in `dtype`)."""
    from inferplug.quant.checkpoint_layers import checkpoint_layer
    from inferplug.quant.group_int4 import unpack_awq, unpack_gptq

    if spec.method == "mxfp4":
        from inferplug.kernels import cpu as cpu_kernels
        from inferplug.models.mxfp4_checkpoint import mxfp4_weights

        return mxfp4_weights(tensors, dtype, as_blocks=cpu_kernels.runs_on("cpu"))

    layers = {}
    for module in sorted(name[: -len(".qweight")] for name in tensors if name.endswith(".qweight")):
        missing = [p for p in PACKED if f"{module}.{p}" not in tensors]
        if missing:
            raise ProfileError(f"{module} has qweight but no {', '.join(missing)}; the {spec.label} checkpoint is "
                               "damaged or incomplete: re-download it")
        g_idx = tensors.pop(f"{module}.g_idx", None)
        # popped into the call, so the packed words go as soon as they are unpacked (one module's at a time)
        if spec.method == "awq":
            quant = unpack_awq(*(tensors.pop(f"{module}.{p}") for p in PACKED), spec.group_size)
        else:
            quant = unpack_gptq(*(tensors.pop(f"{module}.{p}") for p in PACKED), g_idx, spec.group_size,
                                spec.zero_offset, spec.bits)
        layers[f"{module}.weight"] = checkpoint_layer(quant, device, tensors.pop(f"{module}.bias", None))
        del quant
    if not layers:
        raise ProfileError(f"the {spec.label} checkpoint has no qweight tensors; it is not quantized as its "
                           "config says: re-download it")
    return layers


def _quant_config(model_dir: Path) -> dict | None:
    config = model_dir / "config.json"
    if config.is_file():
        raw = json.loads(config.read_text()).get("quantization_config")
        if raw:
            return raw
    separate = model_dir / "quantize_config.json"
    return json.loads(separate.read_text()) if separate.is_file() else None
