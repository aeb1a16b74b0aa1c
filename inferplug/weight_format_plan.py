"""Which weight-only format the native engine stores its linears in (Plan.weight_format), and why: the profile's
int8/int4, an AWQ/GPTQ checkpoint's or a GGUF's own, or fp16 for fp32 compute on an x86 CPU."""

from __future__ import annotations

from inferplug.hardware import GPU, Hardware
from inferplug.kernels import cpu as cpu_kernels
from inferplug.profile import Profile
from inferplug.quant.formats import CHECKPOINT_FORMATS


def native_weight_format(profile: Profile, gpus: list[GPU], hw: Hardware,
                         dtype: str) -> tuple[str | None, list[str]]:
    """The profile's int8/int4, or fp16-stored weights for fp32 compute on an x86 CPU (fbgemm's fp16 GEMM)."""
    fmt = profile.quantization.format
    if fmt in ("int8", "int4"):
        if gpus or not cpu_kernels.runs_on("cpu", hw):
            return fmt, []
        block = {"int8": "Q8_0", "int4": "Q4_1"}[fmt]
        return fmt, [f"{fmt} layers in GGUF {block} blocks on inferplug's AVX2 kernel, int8 activations (as llama.cpp)"]
    if fmt in CHECKPOINT_FORMATS:
        return fmt, [checkpoint_format_why(fmt, gpus, hw)]
    if fmt == "gguf" and not gpus and profile.dtype == "auto" and profile.parallel.tensor_parallel_size == 1 \
            and cpu_kernels.runs_on("cpu", hw):
        return "gguf", ["GGUF blocks run as stored, converted one tensor at a time at load (models/gguf_layers.py): "
                        "Q4_0/Q4_1 as Q4_1 blocks, Q4_K, Q5_0, Q5_K and Q6_K in their own, Q8_0 as Q8_0, exactly; other types "
                        "requantized to Q8_0; "
                        "the head Q6_K or Q8_0 against x in two int8 parts (about 15 bits); int8 activations on the layers' "
                        "kernels (as llama.cpp); "
                        "pin dtype = \"float32\" for dequantized fp32 weights"]
    if not gpus and dtype == "float32" and profile.dtype == "auto" and {"avx2", "f16c"} <= hw.cpu_flags:
        return "fp16", ["linear weights stored fp16 (fbgemm fp16 GEMM, fp32 compute): half the bytes each decode "
                        "step reads, greedy output as in fp32; pin dtype = \"float32\" to keep fp32 weights"]
    return None, []


def checkpoint_format_why(fmt: str, gpus: list[GPU], hw: Hardware) -> str:
    label = fmt.upper()
    if gpus:
        return f"{label} int4 groups run as stored: the Triton int4 group-wise dequant-GEMM (kernels/int4_gemm.py)"
    if not cpu_kernels.runs_on("cpu", hw):
        return f"{label} int4 groups run as stored by a torch dequant-matmul (slow: {cpu_kernels.unavailable_reason(hw)})"
    return (f"{label} int4 groups repacked at load into Q4_1 blocks on inferplug's CPU kernel (groups of 128 keep "
            "one scale and min a group: 4.25 bits, other sizes 5; int8 activations, as llama.cpp); act-order layers "
            "permute their activations")
