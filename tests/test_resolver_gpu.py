"""The resolver with injected GPUs: one 24 GB GPU, one 80 GB GPU, two GPUs, tensor parallel on GPUs and CPUs."""

from __future__ import annotations

import pytest

from inferplug.errors import ResolveError
from inferplug.hardware import GPU
from inferplug.profile import load_profile
from inferplug.resolver import resolve
from tests.resolver_hardware import A100_80, ALL_CPU_PACKAGES, GB, RTX_4090, SMOLLM2, T4, cpu, with_gpus


# --- one 24 GB GPU -------------------------------------------------------------------------------
def test_24gb_gpu_runs_awq_on_the_triton_int4_kernel():
    hw = with_gpus(RTX_4090, packages=ALL_CPU_PACKAGES | {"triton", "exllamav2"})
    plan = resolve(load_profile("zephyr-awq"), hw)
    assert (plan.backend, plan.device, plan.dtype, plan.weight_format) == ("native", "cuda:0", "bfloat16", "awq")
    assert any("Triton int4 group-wise dequant-GEMM" in r for r in plan.reasons)
    assert "layers awq (4.19 bits)" in " ".join(plan.reasons)  # 4 bits + an fp16 scale and a uint8 zero per 128
    assert plan.rejected["exllamav2"] == "ExLlamaV2 loads GPTQ and EXL2 weights, not AWQ"


def test_24gb_gpu_gptq_plan_on_exllamav2_counts_packed_weights():
    hw = with_gpus(RTX_4090, packages=ALL_CPU_PACKAGES | {"triton", "exllamav2"})
    profile = load_profile("mistral-7b-gptq")
    profile.backend = "exllamav2"
    plan = resolve(profile, hw)
    assert (plan.backend, plan.device, plan.dtype) == ("exllamav2", "cuda:0", "float16")
    weights = int(7.24e9 * 4.25 / 8)  # 3_846_250_000 bytes: 4 bits + an fp16 scale and zero per 128 weights
    # CUDA headroom: 768 MiB for the context and allocator (805_306_368) + 5% of the weights for activations
    # (192_312_500), written out here so a change to the resolver's reserve shows up as a failure.
    reserve = 805_306_368 + 192_312_500
    left = 23 * GB - weights - reserve
    per_token = 2 * 32 * 8 * 128 * 1  # cache_mode Q8
    assert plan.memory.weights_bytes == weights
    assert plan.memory.cache_tokens == int(0.9 * left) // per_token // 16 * 16
    assert plan.max_model_len == 4096  # the default context, below the model's 32768
    assert plan.memory.seqs_at_full_context == plan.memory.cache_tokens // 4096 >= 1


def test_old_gpu_gets_float16_and_rejects_pinned_bfloat16():
    plan = resolve(load_profile("smollm2-135m"), with_gpus(T4), SMOLLM2)
    assert plan.dtype == "float16"
    profile = load_profile("smollm2-135m")
    profile.dtype = "bfloat16"
    with pytest.raises(ResolveError, match="compute capability >= 8.0"):
        resolve(profile, with_gpus(T4), SMOLLM2)


def test_gpu_attention_is_triton_decode_or_the_torch_path_without_triton():
    plan = resolve(load_profile("smollm2-135m"), with_gpus(RTX_4090), SMOLLM2)
    assert plan.attention == "triton"
    assert "attention triton: Triton kernels on CUDA: prefill and chunked prefill through block tables" in plan.reasons[3]
    plan = resolve(load_profile("smollm2-135m"), with_gpus(RTX_4090, packages=ALL_CPU_PACKAGES), SMOLLM2)
    assert plan.attention == "torch"
    assert plan.reasons[3].startswith("attention torch: triton is not installed, so torch's paged attention runs")


# --- one 80 GB GPU -------------------------------------------------------------------------------
def test_80gb_gpu_gptq_runs_native_with_exllamav2_usable_too():
    hw = with_gpus(A100_80, packages=ALL_CPU_PACKAGES | {"triton", "exllamav2"})
    plan = resolve(load_profile("mistral-7b-gptq"), hw)
    assert (plan.backend, plan.device, plan.weight_format) == ("native", "cuda:0", "gptq")
    assert plan.rejected["exllamav2"] == "usable, but native ranks first for this profile"
    profile = load_profile("mistral-7b-gptq")
    profile.backend = "exllamav2"
    plan = resolve(profile, hw)
    assert (plan.backend, plan.device, plan.dtype) == ("exllamav2", "cuda:0", "float16")
    assert plan.memory.kv_bytes_per_token == 2 * 32 * 8 * 128 * 1  # cache_mode Q8
    assert plan.max_num_seqs == 256


def test_80gb_gpu_gptq_without_exllamav2_runs_native():
    plan = resolve(load_profile("mistral-7b-gptq"), with_gpus(A100_80))
    assert plan.backend == "native"
    assert plan.rejected["exllamav2"].startswith("not installed (pip install 'inferplug[exllamav2]'")


# --- two GPUs ------------------------------------------------------------------------------------
def test_two_gpus_tensor_parallel():
    gpus = (GPU(0, "A", (9, 0), 80 * GB, 70 * GB), GPU(1, "B", (9, 0), 80 * GB, 60 * GB))
    profile = load_profile("mistral-7b-gptq")
    profile.parallel.tensor_parallel_size = 2
    plan = resolve(profile, with_gpus(*gpus, packages=ALL_CPU_PACKAGES | {"exllamav2"}))
    assert (plan.device, plan.tensor_parallel_size) == ("cuda", 2)
    assert plan.memory.available_bytes == 2 * 60 * GB  # the smaller GPU bounds an even split


def test_two_gpus_without_tensor_parallel_picks_the_freest():
    gpus = (GPU(0, "A", (8, 6), 24 * GB, 5 * GB), GPU(1, "B", (8, 6), 24 * GB, 20 * GB))
    plan = resolve(load_profile("smollm2-135m"), with_gpus(*gpus), SMOLLM2)
    assert plan.device == "cuda:1" and plan.tensor_parallel_size == 1


def test_tensor_parallel_that_does_not_divide_the_heads_is_rejected_with_the_sizes_that_do():
    gpus = (GPU(0, "A", (9, 0), 80 * GB, 70 * GB), GPU(1, "B", (9, 0), 80 * GB, 60 * GB))
    profile = load_profile("smollm2-135m")
    profile.backend = "auto"
    profile.parallel.tensor_parallel_size = 2
    with pytest.raises(ResolveError) as info:
        resolve(profile, with_gpus(*gpus), SMOLLM2)
    assert info.value.rejected["native"] == ("tensor_parallel_size = 2 does not divide the model's 9 attention heads "
                                             "(each rank holds whole heads); use one of [1, 3]")
    assert info.value.rejected["ctranslate2"] == (
        "runs on one device; tensor_parallel_size = 2 is not supported (set it to 1, or use exllamav2, "
        "which splits GPTQ/EXL2 models over several GPUs)")


def test_native_tensor_parallel_on_the_cpu_plans_threads_and_per_rank_memory():
    profile = load_profile("smollm2-135m")
    profile.parallel.tensor_parallel_size = 3
    plan = resolve(profile, cpu(), SMOLLM2)
    assert (plan.backend, plan.device, plan.tensor_parallel_size) == ("native", "cpu", 3)
    assert plan.threads_per_rank == max(cpu().cpu_count // 3, 1)
    assert any(r.startswith("tensor parallel 3 on the CPU: one process per rank over gloo") for r in plan.reasons)
    assert "per rank of 3: weights" in plan.memory.summary()


def test_tensor_parallel_needs_enough_gpus():
    profile = load_profile("mistral-7b-gptq")
    profile.parallel.tensor_parallel_size = 2
    with pytest.raises(ResolveError, match="tensor_parallel_size = 2 needs 2 CUDA GPUs; found 1"):
        resolve(profile, with_gpus(RTX_4090, packages=ALL_CPU_PACKAGES | {"exllamav2"}))
