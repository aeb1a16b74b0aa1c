"""Which CTranslate2 compute type a plan uses: the profile's, or the best one CTranslate2 offers on
the device. The supported set comes from Hardware (probed from the installed ctranslate2, or injected)."""

from __future__ import annotations

from inferplug.memory_plan import DTYPE_BYTES

# models/registry.py's families whose GGUF the CTranslate2 backend converts (backends/ct2_convert.py writes it as an
# HF dir of LlamaForCausalLM, MistralForCausalLM or Qwen2ForCausalLM)
GGUF_FAMILIES = ("llama",)
# the families whose HF dir CTranslate2's converter has a loader for (ctranslate2.converters.transformers: Llama,
# Mistral, Qwen2, Qwen3, Gemma 3 and Gemma 4 configs; tests/test_resolver_ct2.py reads its list)
HF_FAMILIES = ("llama", "qwen3", "gemma3", "gemma4")


def choose_compute_type(pinned: str, quantized: bool, dtype: str, device: str,
                        supported: frozenset[str]) -> tuple[str | None, str]:
    """(compute type, reason); (None, why) when CTranslate2 cannot run the profile on `device`.

    `device` is "cpu" or "cuda"; `dtype` is the float type the resolver would pick for this device.
    """
    if not supported:
        return None, f"CTranslate2 cannot compute on {device} here (it offers no compute type there)"
    offered = ", ".join(sorted(supported))
    if pinned != "auto":  # kept even when not offered: the backend then fails to load, naming the offered ones
        warning = "" if pinned in supported else f"; CTranslate2 here offers only {offered} on {device}, so it will fail"
        return pinned, f"compute_type {pinned}: pinned by the profile{warning}"
    wanted = _preferences(quantized, dtype, device)
    chosen = next((c for c in wanted if c in supported), None)
    if chosen is None:
        return None, f"CTranslate2 here computes only {offered} on {device}, none of {', '.join(wanted)}"
    if chosen == wanted[0]:
        return chosen, f"compute_type {chosen}: " + ("int8 weights" if quantized else f"unquantized weights in {dtype}")
    return chosen, (f"compute_type {chosen}: CTranslate2 cannot compute {wanted[0]} on {device} here "
                    f"(it offers {offered})")


def activation_dtype(compute_type: str) -> str:
    """The float type CTranslate2 computes activations (and keeps the KV cache) in for `compute_type`."""
    floating = compute_type.removeprefix("int8_")
    return floating if floating in DTYPE_BYTES else "float32"  # int8 and int16 compute in float32


def weight_bits(compute_type: str) -> float:
    if compute_type.startswith("int8"):
        return 8.0
    return 16.0 if compute_type in ("int16", "float16", "bfloat16") else 32.0


def _preferences(quantized: bool, dtype: str, device: str) -> list[str]:
    """Best first: the profile's weights in the resolver's dtype, then what is usually there."""
    floats = [dtype] + (["float16"] if device == "cuda" else []) + ["float32"]
    floats = list(dict.fromkeys(floats))
    if not quantized:
        return floats
    int8 = [f"int8_{f}" for f in floats] if device == "cuda" else ["int8", "int8_float32"]
    return list(dict.fromkeys(int8 + ["int8"] + floats))
