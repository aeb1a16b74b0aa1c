"""The resolver's CTranslate2 plans with injected hardware facts: its compute types on CPUs and GPUs, what it
refuses, and the package's own list where none is injected."""

from __future__ import annotations

import dataclasses

import pytest

from inferplug.errors import ResolveError
from inferplug.profile import load_profile
from inferplug.resolver import resolve
from tests.resolver_hardware import CT2_CPU, RTX_4090, SMOLLM2, T4, cpu, with_gpus


def test_ct2_refuses_a_gguf_of_a_family_it_cannot_convert():
    """CTranslate2 reads a GGUF through an HF dir our loader writes, for Llama-family files only: a profile pinning it
    for a Qwen3 GGUF is refused with the reason and the fix, before any conversion starts."""
    facts = dataclasses.replace(SMOLLM2, family="qwen3", gguf_matrices=(("layer", "Q4_K", 1000),))
    with pytest.raises(ResolveError, match="converts a GGUF of llama models only .* use the native backend"):
        resolve(load_profile("smollm2-135m-ct2"), cpu(), facts)


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen35", "gpt_oss"])
def test_ct2_refuses_an_hf_dir_its_converter_has_no_loader_for(family):
    facts = dataclasses.replace(SMOLLM2, family=family)
    with pytest.raises(ResolveError, match=f"no loader for a {family} model .* use the native backend"):
        resolve(load_profile("smollm2-135m-ct2"), cpu(), facts)


def test_the_families_ct2_converts_are_those_its_converter_has_loaders_for():
    from ctranslate2.converters.transformers import _MODEL_LOADERS
    from transformers import CONFIG_MAPPING

    from inferplug.ct2_compute import HF_FAMILIES
    from inferplug.models.registry import FAMILIES

    for family in FAMILIES:
        loaders = {CONFIG_MAPPING[t].__name__ in _MODEL_LOADERS for t in family.hf_model_types}
        assert loaders == {family.name in HF_FAMILIES}, family.name


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
