"""The native engine's K/V pool dtype: kv_dtype = "auto" is float16 where inferplug's CPU kernels run (they store
K/V rounded to fp16 and read it back to fp32), the compute dtype elsewhere; a pinned kv_dtype wins. The memory plan
counts the pools' bytes a value."""

from __future__ import annotations

import pytest

from inferplug.profile import load_profile
from inferplug.resolver import resolve
from tests.resolver_hardware import A100_80, SMOLLM2, cpu, with_gpus

KERNEL_CPU = ("avx2", "fma", "f16c")  # the flags the CPU kernels need (kernels/cpu/__init__.py)
KERNEL = "inferplug's C++ kernels take every attention row"


def kv_bytes_per_token(value_bytes: int) -> int:
    return 2 * 30 * 3 * 64 * value_bytes  # K and V x SmolLM2's layers x kv heads x head_dim


@pytest.fixture(autouse=True)
def kernels_on(monkeypatch):
    monkeypatch.delenv("INFERPLUG_NO_CPU_KERNELS", raising=False)


def profile(kv_dtype: str = "auto"):
    p = load_profile("smollm2-135m")
    p.cache.kv_dtype = kv_dtype
    return p


def test_auto_is_float16_where_the_cpu_kernels_run_and_says_why():
    plan = resolve(profile(), cpu(flags=KERNEL_CPU), SMOLLM2)
    assert (plan.dtype, plan.kv_dtype) == ("float32", "float16")
    assert plan.memory.kv_bytes_per_token == kv_bytes_per_token(2)
    assert any(r.startswith("kv_dtype float16: inferplug's CPU kernels store K/V rounded to fp16") for r in plan.reasons)
    assert plan.attention == "cpu-kernels" and KERNEL in plan.reasons[3]
    fp32 = resolve(profile("float32"), cpu(flags=KERNEL_CPU), SMOLLM2)
    assert plan.memory.cache_tokens // 16 == pytest.approx(2 * fp32.memory.cache_tokens // 16, abs=1)  # same cache bytes


def test_pinned_float32_keeps_fp32_pools_on_the_kernels():
    plan = resolve(profile("float32"), cpu(flags=KERNEL_CPU), SMOLLM2)
    assert plan.kv_dtype == "float32" and plan.memory.kv_bytes_per_token == kv_bytes_per_token(4)
    assert "kv_dtype float32: pinned by the profile" in plan.reasons and KERNEL in plan.reasons[3]


def test_auto_keeps_the_compute_dtype_where_the_kernels_do_not_run(monkeypatch):
    """The torch path keeps what it ran before: fp32 pools on a CPU, the compute dtype on a GPU."""
    no_f16c = resolve(profile(), cpu(), SMOLLM2)
    assert no_f16c.kv_dtype == "float32" and "kv_dtype float32: the compute dtype" in no_f16c.reasons
    assert resolve(profile(), with_gpus(A100_80), SMOLLM2).kv_dtype == "bfloat16"
    monkeypatch.setenv("INFERPLUG_NO_CPU_KERNELS", "1")
    assert resolve(profile(), cpu(flags=KERNEL_CPU), SMOLLM2).kv_dtype == "float32"


def test_pinned_bfloat16_pools_take_the_torch_path():
    plan = resolve(profile("bfloat16"), cpu(flags=KERNEL_CPU), SMOLLM2)
    assert plan.kv_dtype == "bfloat16" and plan.memory.kv_bytes_per_token == kv_bytes_per_token(2)
    assert plan.attention == "torch" and KERNEL not in plan.reasons[3]


def test_auto_prefill_gemm_is_bf16_where_the_cpu_has_avx512_bf16():
    """The quality rule admits bf16 prompt GEMMs (KLD 1.1e-4 < Q8_0's 1.3e-3); only vdpbf16ps makes them faster."""
    base = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni")
    with_bf16 = resolve(load_profile("smollm2-135m"), cpu(flags=(*base, "avx512_bf16")), SMOLLM2)
    assert with_bf16.prefill_gemm == "bfloat16" and any("AVX512_BF16" in r for r in with_bf16.reasons)
    assert resolve(load_profile("smollm2-135m"), cpu(flags=base), SMOLLM2).prefill_gemm == "float32"
    pinned = load_profile("smollm2-135m")
    pinned.native.prefill_gemm = "float32"
    assert resolve(pinned, cpu(flags=(*base, "avx512_bf16")), SMOLLM2).prefill_gemm == "float32"
