"""The resolver with injected hardware facts: CPU only and no optional backend installed (GPUs and tensor parallel:
test_resolver_gpu.py; CTranslate2: test_resolver_ct2.py; the memory plan: test_resolver_memory.py)."""

from __future__ import annotations

import dataclasses

import pytest

from inferplug.errors import InferPlugDeprecationWarning, ResolveError
from inferplug.profile import Profile, load_profile
from inferplug.resolver import resolve
from tests.resolver_hardware import A100_80, ALL_CPU_PACKAGES, RTX_4090, SMOLLM2, GiB, cpu, with_gpus


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


def test_an_moe_on_the_cpu_takes_prompt_chunks_beside_decode_rows_uncapped():
    """A dense model's prompt chunks shrink to 16 tokens while streams decode; an MoE's take the whole step budget
    (resolver.DEFAULT_PREFILL_WHILE_DECODING: small chunks pay for unpacking the experts they pick), and a profile's
    own cap wins either way."""
    profile = load_profile("smollm2-135m")
    assert resolve(profile, cpu(), SMOLLM2).max_prefill_tokens_while_decoding == 16
    moe = dataclasses.replace(SMOLLM2, num_experts=128)
    assert resolve(profile, cpu(), moe).max_prefill_tokens_while_decoding == 0
    pinned = profile.model_copy(update={"limits": profile.limits.model_copy(update={"max_prefill_tokens_while_decoding": 32})})
    assert resolve(pinned, cpu(), moe).max_prefill_tokens_while_decoding == 32


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
    # a Q4_K_M file's Q6_K head stays Q6_K (6.5625 bits), its Q5_0 rows Q5_0 (5.5)
    facts_q6_head = dataclasses.replace(facts, gguf_matrices=(*layers, ("layer", "Q5_0", 256), ("head", "Q6_K", embed)))
    plan = resolve(load_profile("smollm2-135m"), cpu(flags=("avx2", "fma", "f16c")), facts_q6_head)
    assert plan.memory.weights_bytes == pytest.approx(
        (q4 * 5 + 1000 * 6.5625 + 512 * 5.625 + 256 * 5.5 + embed * 6.5625) / 8, abs=1)
    profile = load_profile("smollm2-135m")
    profile.dtype = "float32"
    assert resolve(profile, cpu(flags=("avx2", "fma", "f16c")), facts).weight_format is None
    assert resolve(load_profile("smollm2-135m"), cpu(), facts).weight_format is None  # no kernels without F16C
    assert resolve(load_profile("smollm2-135m"), with_gpus(A100_80), facts).weight_format is None


@pytest.mark.parametrize("fmt", ["awq", "gptq", "exl2"])
def test_a_checkpoint_format_named_for_a_gguf_is_refused_with_the_formats_it_takes(fmt):
    from inferplug.errors import ProfileError

    facts = dataclasses.replace(SMOLLM2, gguf_matrices=(("layer", "Q4_1", SMOLLM2.num_parameters),))
    profile = load_profile("smollm2-135m")
    profile.quantization.format = fmt
    with pytest.raises(ProfileError, match=f"format = '{fmt}' names a checkpoint kind.*is a GGUF.*format = \"gguf\""):
        resolve(profile, cpu(flags=("avx2", "fma", "f16c")), facts)


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
                                         ("qwen3_moe", "one kernel call"), ("gpt_oss", "one kernel call"),
                                         ("gemma3", "one kernel call"), ("qwen35", "one kernel call"),
                                         ("new", "layer by layer")])
def test_resolve_names_the_model_family_and_the_decode_path_it_takes(family, path, monkeypatch):
    """A family the one-call decode kernel does not cover yet (a new one, until decode_layers takes what it adds)
    still runs, layer by layer, and resolve says so."""
    from inferplug.models import registry

    if family == "new":
        monkeypatch.setitem(registry._BY_NAME, "new", dataclasses.replace(
            registry.family("qwen3"), name="new", fused_decode=False, unfused_why="its new layers"))
    facts = dataclasses.replace(SMOLLM2, family=family)
    plan = resolve(load_profile("smollm2-135m"), cpu(flags=("avx2", "fma", "f16c")), facts)
    (reason,) = [r for r in plan.reasons if r.startswith("model family")]
    assert f"model family: {family}" in reason and path in reason
