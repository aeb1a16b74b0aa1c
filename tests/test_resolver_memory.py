"""The resolver's memory plan with injected hardware facts: the KV cache from what the weights leave, a draft
model's share, and the errors that give the numbers when nothing fits."""

from __future__ import annotations

import pytest

from inferplug.errors import ResolveError
from inferplug.profile import Profile, load_profile
from inferplug.resolver import model_facts, resolve
from tests.resolver_hardware import GB, RTX_4090, SMOLLM2, GiB, cpu, with_gpus


def test_small_cache_clamps_max_model_len():
    profile = load_profile("smollm2-135m")
    profile.cache.memory = "64MiB"
    plan = resolve(profile, cpu(), SMOLLM2)
    assert plan.max_model_len == plan.memory.cache_tokens < 8192
    assert plan.memory.seqs_at_full_context == 1
    assert any("the KV cache holds only" in r for r in plan.reasons)


def test_a_draft_models_weights_and_kv_pool_count_in_the_memory_plan():
    from inferplug.profile import ArchitectureHints, ModelSource, Speculative

    profile = load_profile("smollm2-135m")
    profile.cache.memory = "256MiB"
    alone = resolve(profile, cpu(), SMOLLM2).memory
    hints = ArchitectureHints(num_parameters=40e6, num_hidden_layers=4, num_key_value_heads=3, head_dim=64,
                              max_position_embeddings=8192)
    profile.speculative = Speculative(method="draft", draft_model=ModelSource(hf_repo="x/draft", hints=hints))
    plan = resolve(profile, cpu(), SMOLLM2)
    # the draft's pool holds as many blocks as the target's: every cached token pays both models' KV
    assert plan.memory.kv_bytes_per_token == alone.kv_bytes_per_token * 34 // 30
    assert plan.memory.weights_bytes == alone.weights_bytes + int(40e6 * plan.memory.weight_bits / 8)
    assert plan.num_kv_blocks < alone.cache_tokens // profile.cache.block_size
    assert "draft model included" in plan.memory.summary()


def test_model_too_big_for_ram_names_the_numbers():
    profile = load_profile("smollm2-135m")
    with pytest.raises(ResolveError) as info:
        resolve(profile, cpu(ram_free=GiB // 4), SMOLLM2)
    assert "weights need 0.50 GiB" in str(info.value) and "only 0.25 GiB is available on cpu" in str(info.value)


def test_cache_size_larger_than_what_is_left():
    profile = load_profile("smollm2-135m")
    profile.cache.memory = "30GiB"
    with pytest.raises(ResolveError) as info:
        resolve(profile, cpu(), SMOLLM2)
    assert "cache.memory = '30GiB' asks for 30.00 GiB" in str(info.value)


@pytest.mark.smollm2
def test_model_facts_from_the_real_gguf_header(smollm2_gguf):
    facts = model_facts(load_profile("smollm2-135m"))
    assert (facts.num_hidden_layers, facts.num_key_value_heads, facts.head_dim) == (30, 3, 64)
    assert facts.max_position_embeddings == 8192
    assert 130e6 < facts.num_parameters < 140e6


def test_auto_cache_on_cpu_is_capped_at_4gib_and_at_what_the_limits_can_use():
    model = {"pypi": "x==1", "file": "m.gguf"}
    per_token = 2 * 30 * 3 * 64 * 4
    plan = resolve(Profile(backend="native", dtype="float32", model=model), cpu(), SMOLLM2)
    assert plan.memory.kv_budget_bytes == 4 * GiB  # 16 seqs x 8192 tokens would need 5.6 GiB
    assert plan.memory.cache_tokens == 4 * GiB // per_token // 16 * 16
    small = Profile(backend="native", dtype="float32", model=model, limits={"max_num_seqs": 2})
    plan = resolve(small, cpu(), SMOLLM2)
    assert plan.memory.cache_tokens == 2 * 8192 and plan.memory.seqs_at_full_context == 2


def test_auto_cache_on_cuda_takes_90_percent_of_what_is_left():
    profile = Profile(backend="native", model={"pypi": "x==1", "file": "m.gguf"}, limits={"max_num_seqs": 10_000})
    plan = resolve(profile, with_gpus(RTX_4090), SMOLLM2)
    m = plan.memory
    assert m.kv_budget_bytes == int(0.9 * (23 * GB - m.weights_bytes - m.reserve_bytes))
