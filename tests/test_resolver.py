"""The resolver with injected hardware facts: CPU only, one 24 GB GPU, one 80 GB GPU, two GPUs,
and no optional backend installed (the memory plan's tests: test_resolver_memory.py)."""

from __future__ import annotations

import dataclasses

import pytest

from inferplug.errors import InferPlugDeprecationWarning, ResolveError
from inferplug.hardware import GPU
from inferplug.profile import Profile, load_profile
from inferplug.resolver import resolve
from tests.resolver_hardware import A100_80, ALL_CPU_PACKAGES, CT2_CPU, GB, RTX_4090, SMOLLM2, T4, GiB, cpu, with_gpus


# --- CPU only ------------------------------------------------------------------------------------
def test_cpu_only_default_profile_runs_native_fp32():
    plan = resolve(load_profile("smollm2-135m"), cpu(), SMOLLM2)
    assert (plan.backend, plan.device, plan.dtype, plan.attention) == ("native", "cpu", "float32", "torch")
    assert "exllamav2" in plan.rejected and "needs a CUDA GPU; none found" in plan.rejected["exllamav2"]
    assert any(r.startswith("dtype float32: on a CPU activations and accumulation stay fp32") for r in plan.reasons)
    # KV bytes/token = 2 x layers x kv_heads x head_dim x 4 bytes; the cache is "1GiB" in the profile
    per_token = 2 * 30 * 3 * 64 * 4
    assert plan.memory.kv_bytes_per_token == per_token
    assert plan.memory.weights_bytes == int(SMOLLM2.num_parameters * 32 / 8)
    assert plan.memory.cache_tokens == GiB // per_token // 16 * 16
    assert plan.num_kv_blocks == plan.memory.cache_tokens // 16
    assert plan.max_model_len == 4096  # the default context: the model's 8192 is a ceiling
    assert plan.memory.seqs_at_full_context == plan.memory.cache_tokens // 4096


def test_cpu_attention_reason_says_the_cpp_kernel_takes_every_row_where_it_runs(monkeypatch):
    monkeypatch.delenv("INFERPLUG_NO_CPU_KERNELS", raising=False)
    kernel = "inferplug's C++ kernels take every attention row, prefill too"
    plan = resolve(load_profile("smollm2-135m"), cpu(flags=("avx2", "fma", "f16c")), SMOLLM2)
    assert plan.attention == "cpu-kernels" and kernel in plan.reasons[3]
    assert kernel not in resolve(load_profile("smollm2-135m"), cpu(), SMOLLM2).reasons[3]  # no F16C: torch runs it


def test_native_int4_counts_the_float_embedding_and_the_int8_head():
    """quantize_model leaves the embedding float and gives the tied head an int8 copy (tests/quant checks bytes)."""
    facts = dataclasses.replace(SMOLLM2, vocab_size=49152, hidden_size=576, tie_word_embeddings=True)
    plan = resolve(load_profile("smollm2-135m-int4"), cpu(), facts)
    embed = 49152 * 576
    layers = SMOLLM2.num_parameters - embed
    assert plan.weight_format == "int4"
    assert plan.memory.weights_bytes == pytest.approx(layers * 5 / 8 + embed * 4 + embed * 8.5 / 8, abs=1)  # Q4_1, Q8_0
    assert "weights: 12.47 bits/param on average: layers int4 (5 bits), embedding float32, lm_head an int8 copy " \
           "of the tied embedding" in plan.reasons
    unknown = resolve(load_profile("smollm2-135m-int4"), cpu(), SMOLLM2)  # [model.hints] give no embedding size
    assert unknown.memory.weight_bits == 5


def test_a_quantized_gguf_runs_its_own_blocks_on_the_cpu_kernels():
    """The file's bits, each matrix in the block it loads as (models/gguf_layers.py); a pinned dtype keeps fp32."""
    embed = 49152 * 576
    layers = (("layer", "Q4_1", SMOLLM2.num_parameters - embed - 1512), ("layer", "Q6_K", 1000), ("layer", "Q5_K", 512))
    facts = dataclasses.replace(SMOLLM2, vocab_size=49152, hidden_size=576, tie_word_embeddings=True,
                                gguf_matrices=(*layers, ("head", "Q8_0", embed)))
    plan = resolve(load_profile("smollm2-135m"), cpu(flags=("avx2", "fma", "f16c")), facts)
    assert (plan.dtype, plan.weight_format) == ("float32", "gguf")
    assert any("GGUF blocks run as stored" in r for r in plan.reasons)
    q4 = SMOLLM2.num_parameters - embed - 1512  # Q4_1 at 5 bits; Q6_K as its own 6.5625, Q5_K its 5.625; the head
    # at Q8_0's 8.5
    assert plan.memory.weights_bytes == pytest.approx((q4 * 5 + 1000 * 6.5625 + 512 * 5.625 + embed * 8.5) / 8, abs=1)
    assert any("the GGUF's matrices load as" in r and "Q5_K" in r for r in plan.reasons)
    profile = load_profile("smollm2-135m")
    profile.dtype = "float32"
    assert resolve(profile, cpu(flags=("avx2", "fma", "f16c")), facts).weight_format is None
    assert resolve(load_profile("smollm2-135m"), cpu(), facts).weight_format is None  # no kernels without F16C
    assert resolve(load_profile("smollm2-135m"), with_gpus(A100_80), facts).weight_format is None


def test_fp32_on_an_x86_cpu_with_f16c_stores_float_linear_weights_fp16():
    """fbgemm's fp16 GEMM (AVX2 + F16C) halves the bytes a decode step reads; a pinned dtype keeps fp32."""
    facts = dataclasses.replace(SMOLLM2, vocab_size=49152, hidden_size=576, tie_word_embeddings=True)
    profile = load_profile("smollm2-135m")
    profile.quantization.format = "none"
    plan = resolve(profile, cpu(flags=("avx2", "fma", "f16c")), facts)
    assert (plan.dtype, plan.weight_format) == ("float32", "fp16")
    assert any("linear weights stored fp16" in r for r in plan.reasons)
    embed = 49152 * 576
    assert plan.memory.weights_bytes == pytest.approx((SMOLLM2.num_parameters - embed) * 2 + embed * 4 + embed * 2, abs=1)
    profile.dtype = "float32"
    assert resolve(profile, cpu(flags=("avx2", "fma", "f16c")), facts).weight_format is None


def test_cpu_with_avx512_bf16_or_amx_still_computes_fp32_on_the_files_blocks(monkeypatch):
    """bf16 activations changed SmolLM2's greedy answers on an AVX512_BF16 host, so no ISA makes them the default.
    (The CPU kernels run there, so the K/V pools are fp16: tests/test_resolver_kv_dtype.py.)"""
    monkeypatch.delenv("INFERPLUG_NO_CPU_KERNELS", raising=False)
    for flags in (("avx2", "fma", "f16c", "avx512f", "avx512_bf16"), ("avx2", "fma", "f16c", "amx_tile", "amx_bf16")):
        plan = resolve(load_profile("smollm2-135m"), cpu(flags=flags), SMOLLM2)
        assert (plan.dtype, plan.kv_dtype, plan.weight_format) == ("float32", "float16", "gguf")
        assert plan.memory.kv_bytes_per_token == 2 * 30 * 3 * 64 * 2


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_pinned_16_bit_dtype_on_a_cpu_is_opt_in_and_says_so(dtype):
    profile = load_profile("smollm2-135m")
    profile.dtype = dtype
    plan = resolve(profile, cpu(flags=("avx2", "fma", "f16c", "avx512f", "avx512_bf16")), SMOLLM2)
    assert (plan.dtype, plan.kv_dtype, plan.weight_format) == (dtype, dtype, None)
    assert any(r.startswith(f"dtype {dtype}: pinned by the profile (opt-in: ") and "can differ from float32" in r
               for r in plan.reasons)


def test_pinned_dtype_wins_over_the_isa():
    profile = load_profile("smollm2-135m")
    profile.dtype = "float32"
    plan = resolve(profile, cpu(flags=("avx512_bf16",)), SMOLLM2)
    assert plan.dtype == "float32" and "pinned" in plan.reasons[2]


def test_cpu_only_zephyr_awq_runs_native_repacked_into_q4_blocks():
    plan = resolve(load_profile("zephyr-awq"), cpu(flags=("avx2", "fma", "f16c")))  # from [model.hints]
    assert (plan.backend, plan.device, plan.dtype, plan.weight_format) == ("native", "cpu", "float32", "awq")
    assert any(r.startswith("AWQ int4 groups repacked at load into Q4_1 blocks") for r in plan.reasons)
    # layers at 4.25 bits (Q4_1 blocks, one scale and min per group of 128), the float32 embedding and an int8
    # (8.5-bit) copy of it as the lm_head
    embed = 32000 * 4096
    expected = (7.24e9 - 2 * embed) * 4.25 + embed * 32 + embed * 8.5
    assert plan.memory.weights_bytes == int(expected / 8)  # ~4.1 GiB
    assert plan.rejected["ctranslate2"].startswith("cannot load AWQ weights")


def test_cpu_only_gptq_runs_native_with_exllamav2_the_cuda_alternative():
    plan = resolve(load_profile("mistral-7b-gptq"), cpu())
    assert (plan.backend, plan.weight_format) == ("native", "gptq")
    assert plan.reasons[0] == "backend native: first usable in the order native > exllamav2"
    assert plan.rejected["exllamav2"].startswith("needs a CUDA GPU; none found (it would need one with about")


def test_awq_on_a_cpu_too_small_says_what_it_needs():
    with pytest.raises(ResolveError, match=r"native: weights need 4.07 GiB \(7.24B params x 4.82932 bits\)"):
        resolve(load_profile("zephyr-awq"), cpu(ram_free=4 * GiB))


def test_ct2_refuses_a_gguf_of_a_family_it_cannot_convert():
    """CTranslate2 reads a GGUF through an HF dir our loader writes, for Llama-family files only: a profile pinning it
    for a Qwen3 GGUF is refused with the reason and the fix, before any conversion starts."""
    facts = dataclasses.replace(SMOLLM2, family="qwen3", gguf_matrices=(("layer", "Q4_K", 1000),))
    with pytest.raises(ResolveError, match="converts a GGUF of llama models only .* use the native backend"):
        resolve(load_profile("smollm2-135m-ct2"), cpu(), facts)


def test_ct2_profile_on_cpu_uses_int8():
    plan = resolve(load_profile("smollm2-135m-ct2"), cpu(), SMOLLM2)
    assert (plan.backend, plan.compute_type, plan.attention) == ("ctranslate2", "int8", "ctranslate2")
    assert plan.memory.weight_bits == 8


def test_ct2_unquantized_on_a_bf16_cpu_falls_back_to_a_compute_type_ctranslate2_offers():
    profile = load_profile("smollm2-135m-ct2")
    profile.quantization.format = "none"
    profile.dtype = "bfloat16"  # a CPU computes fp32 unless pinned
    plan = resolve(profile, cpu(flags=("avx512f", "avx512_bf16")), SMOLLM2)
    assert (plan.compute_type, plan.dtype, plan.kv_dtype) == ("float32", "float32", "float32")
    why = "compute_type float32: CTranslate2 cannot compute bfloat16 on cpu here (it offers float32, int8, int8_float32)"
    assert why in plan.reasons
    assert plan.memory.weight_bits == 32 and plan.memory.kv_bytes_per_token == 2 * 30 * 3 * 64 * 4
    plan = resolve(profile, cpu(flags=("avx512_bf16",), ct2=CT2_CPU | {"bfloat16"}), SMOLLM2)
    assert plan.compute_type == plan.dtype == "bfloat16"
    assert "compute_type bfloat16: unquantized weights in bfloat16" in plan.reasons


def test_ct2_pinned_compute_type_is_kept_and_flagged_when_not_offered():
    profile = load_profile("smollm2-135m-ct2")
    profile.ctranslate2.compute_type = "int8_float16"  # the backend raises BackendUnavailable when it loads
    plan = resolve(profile, cpu(), SMOLLM2)
    assert plan.compute_type == "int8_float16"
    assert ("compute_type int8_float16: pinned by the profile; CTranslate2 here offers only float32, int8, "
            "int8_float32 on cpu, so it will fail") in plan.reasons


def test_ct2_on_cuda_uses_int8_with_the_gpu_dtype():
    plan = resolve(load_profile("smollm2-135m-ct2"), with_gpus(RTX_4090), SMOLLM2)
    assert (plan.device, plan.compute_type, plan.dtype) == ("cuda:0", "int8_bfloat16", "bfloat16")
    plan = resolve(load_profile("smollm2-135m-ct2"), with_gpus(T4), SMOLLM2)
    assert (plan.compute_type, plan.dtype) == ("int8_float16", "float16")


def test_ct2_that_cannot_run_on_cuda_is_rejected():
    hw = dataclasses.replace(with_gpus(RTX_4090), ct2_compute_types={"cpu": CT2_CPU})  # no CUDA in ctranslate2
    with pytest.raises(ResolveError) as info:
        resolve(load_profile("smollm2-135m-ct2"), hw, SMOLLM2)
    assert info.value.rejected["ctranslate2"] == (
        "CTranslate2 cannot compute on cuda here (it offers no compute type there)")


def test_ct2_compute_types_come_from_the_installed_package_when_not_injected():
    import ctranslate2

    hw = dataclasses.replace(cpu(), ct2_compute_types=None)
    assert hw.ct2_compute_types_on("cpu") == ctranslate2.get_supported_compute_types("cpu")
    plan = resolve(load_profile("smollm2-135m-ct2"), hw, SMOLLM2)
    assert plan.compute_type in ctranslate2.get_supported_compute_types("cpu")


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


# --- no optional backend installed ---------------------------------------------------------------
def test_no_backend_installed():
    with pytest.raises(ResolveError) as info:
        resolve(load_profile("smollm2-135m"), cpu(packages=()), SMOLLM2)
    message = str(info.value)
    assert "native: needs torch" in message
    assert "Usable instead" not in message


def test_auto_profile_without_torch_falls_back_to_ctranslate2():
    profile = load_profile("smollm2-135m")
    profile.backend = "auto"
    plan = resolve(profile, cpu(packages={"ctranslate2"}), SMOLLM2)
    assert plan.backend == "ctranslate2"
    assert "needs torch" in plan.rejected["native"]


def test_pinned_backend_unusable_says_what_is_usable_instead():
    with pytest.raises(ResolveError, match="Usable instead: ctranslate2"):
        resolve(load_profile("smollm2-135m"), cpu(packages={"ctranslate2"}), SMOLLM2)


def test_openai_profile_needs_no_local_memory():
    plan = resolve(load_profile("openai-remote"), cpu(packages={"httpx"}))
    assert (plan.backend, plan.device, plan.memory) == ("openai", "remote", None)
    with pytest.raises(ResolveError, match="needs httpx"):
        resolve(load_profile("openai-remote"), cpu(packages=()))


def test_attention_pin_checked_against_hardware_and_the_engine():
    profile = Profile(backend="native", attention="triton", model={"pypi": "x==1", "file": "m.gguf"})
    with pytest.raises(ResolveError, match="attention = 'triton' needs a CUDA GPU"):
        resolve(profile, cpu(), SMOLLM2)
    profile.attention = "flash"
    with pytest.raises(ResolveError, match="'flash' needs the flash-attn package"):
        resolve(profile, with_gpus(RTX_4090), SMOLLM2)
    plan = resolve(profile, with_gpus(RTX_4090, packages=ALL_CPU_PACKAGES | {"triton", "flash_attn"}), SMOLLM2)
    assert plan.attention == "flash" and "flash-attn's varlen kernel for prefill" in plan.reasons[3]
    profile.attention = "cpu-kernels"
    with pytest.raises(ResolveError, match="'cpu-kernels' cannot run here: the CPU lacks f16c"):
        resolve(profile, cpu(), SMOLLM2)
    profile.attention = "torch"
    plan = resolve(profile, cpu(), SMOLLM2)
    assert plan.attention == "torch" and "pinned by the profile; torch's paged attention runs" in plan.reasons[3]


def test_old_attention_names_still_run_and_warn_with_the_new_name(monkeypatch):
    monkeypatch.delenv("INFERPLUG_NO_CPU_KERNELS", raising=False)
    profile = Profile(backend="native", attention="sdpa", model={"pypi": "x==1", "file": "m.gguf"})
    kernels_cpu = cpu(flags=("avx2", "fma", "f16c"))
    with pytest.warns(InferPlugDeprecationWarning, match="'sdpa' is renamed: here it runs 'cpu-kernels'"):
        plan = resolve(profile, kernels_cpu, SMOLLM2)
    assert plan.attention == "cpu-kernels" and "the old name of 'cpu-kernels'" in plan.reasons[3]
    with pytest.warns(InferPlugDeprecationWarning, match="set attention = 'torch'"):
        assert resolve(profile, cpu(), SMOLLM2).attention == "torch"  # no F16C: the old name ran torch here
    profile.attention = "torch"  # it ran the C++ kernels where they ran; now it is torch's attention, and says so
    with pytest.warns(InferPlugDeprecationWarning, match="set attention = 'cpu-kernels'"):
        plan = resolve(profile, kernels_cpu, SMOLLM2)
    assert (plan.attention, plan.kv_dtype) == ("torch", "float32")  # fp16 pools are the kernels' only
    assert "until this release 'torch' ran the C++ kernels" in plan.reasons[3]


def test_fp8_kv_pools_are_planned_on_cuda_only():
    model, limits = {"pypi": "x==1", "file": "m.gguf"}, {"max_model_len": 8192}  # the pool bound by memory, not limits
    profile = Profile(backend="native", cache={"kv_dtype": "float8_e4m3"}, model=model, limits=limits)
    with pytest.raises(ResolveError, match="'float8_e4m3' needs a CUDA GPU"):
        resolve(profile, cpu(), SMOLLM2)
    plan = resolve(profile, with_gpus(RTX_4090), SMOLLM2)
    half = resolve(Profile(backend="native", model=model, limits=limits), with_gpus(RTX_4090), SMOLLM2)
    assert plan.kv_dtype == "float8_e4m3" and plan.attention == "triton"
    assert plan.num_kv_blocks > 1.9 * half.num_kv_blocks  # one byte a value instead of bf16's two


def test_replicas_say_how_requests_are_routed():
    pytest.importorskip("ray")
    profile = load_profile("smollm2-135m")
    profile.parallel.replicas = 2
    last = resolve(profile, cpu(), SMOLLM2).reasons[-1]
    assert last.startswith("replicas 2: one Ray Serve deployment") and "prefix-cache-aware" in last
    profile.parallel.routing = "power_of_two"
    assert "routing power of two: pinned by the profile" in resolve(profile, cpu(), SMOLLM2).reasons[-1]
    profile.parallel.replicas = 1
    assert not any(r.startswith("replicas") for r in resolve(profile, cpu(), SMOLLM2).reasons)


@pytest.mark.parametrize("family,path", [("llama", "one kernel call"), ("qwen3", "one kernel call"),
                                         ("qwen3_moe", "layer by layer"), ("gemma3", "one kernel call")])
def test_resolve_names_the_model_family_and_the_decode_path_it_takes(family, path):
    """A family the one-call decode kernel does not cover yet still runs, layer by layer, and resolve says so."""
    facts = dataclasses.replace(SMOLLM2, family=family)
    plan = resolve(load_profile("smollm2-135m"), cpu(flags=("avx2", "fma", "f16c")), facts)
    (reason,) = [r for r in plan.reasons if r.startswith("model family")]
    assert f"model family: {family}" in reason and path in reason
