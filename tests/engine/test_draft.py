"""The draft-model proposer: its q is the draft model's own distribution (transformers' logits) under the request's
sampling, an aborted speculation returns both pools' blocks, a profile runs it end to end, and a draft that does
not share the target's tokenizer (or context) is a clear ProfileError."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from inferplug.backends.native import build_engine, load_draft
from inferplug.engine.config import EngineConfig
from inferplug.engine.sampler import sampling_probs
from inferplug.errors import ProfileError
from inferplug.hardware import Hardware
from inferplug.profile import ModelSource, load_profile
from inferplug.resolver import resolve
from inferplug.types import Request, SamplingParams
from tests.engine.engine_helpers import greedy, hf_model, make_engine, prompts_of, run_all, tokens_of

DRAFT = {"speculative_method": "draft", "num_speculative_tokens": 3}


def _draft(path):
    return load_draft(ModelSource(path=path), EngineConfig())


def test_sampled_proposals_carry_the_draft_models_q_and_an_abort_frees_both_pools(tiny_llama_dir, tiny_draft_dir):
    engine = make_engine(tiny_llama_dir, draft=_draft(tiny_draft_dir), **DRAFT)
    params = SamplingParams(temperature=0.7, top_k=50, seed=3, max_tokens=20, ignore_eos=True)
    engine.add_request(Request(prompt=prompts_of([9])[0], params=params, request_id="r"))
    engine.step()  # the prompt, and the first token
    engine.scheduler.schedule()  # proposes, as the next step would, then stops there
    (seq,) = engine.scheduler.running
    assert len(seq.spec_token_ids) == 3 and seq.spec_probs.shape == (3, 320)
    tokens = torch.tensor([seq.token_ids + seq.spec_token_ids])
    with torch.no_grad():
        logits = hf_model(tiny_draft_dir)(tokens).logits[0, len(seq.token_ids) - 1:-1]
    for i, row in enumerate(logits):
        torch.testing.assert_close(seq.spec_probs[i], sampling_probs(row, params), rtol=1e-4, atol=1e-6)
        assert seq.spec_probs[i][seq.spec_token_ids[i]] > 0
    assert engine.kv_pools[1].num_used > 0
    engine.abort("r")  # mid-speculation: the fixture checks both pools come back whole
    assert not engine.proposer.shadows


def test_a_profile_with_a_draft_model_speculates(tiny_llama_dir, tiny_draft_dir, tmp_path):
    path = tmp_path / "draft.toml"
    path.write_text(f'backend = "native"\ndtype = "float32"\n[model]\npath = "{tiny_llama_dir}"\n'
                    f'[cache]\nmemory = "8MiB"\n[speculative]\nmethod = "draft"\nnum_tokens = 3\n'
                    f'[speculative.draft_model]\npath = "{tiny_draft_dir}"\n')
    profile = load_profile(path)
    hardware = Hardware(cpu_flags=frozenset({"avx2"}), cpu_count=2, ram_total=8 << 30, ram_available=4 << 30,
                        packages=frozenset({"torch", "transformers"}))
    engine = build_engine(profile, resolve(profile, hardware))
    engine.add_request(Request(prompt=prompts_of([7])[0], request_id="r",
                               params=SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)))
    while engine.has_unfinished():
        engine.step()
    stats = engine.stats()
    assert stats["spec_draft_tokens"] > 0 and "spec_acceptance_rate" in stats and "spec_mean_accepted_length" in stats
    assert all(pool.num_free == pool.num_blocks for pool in engine.kv_pools)


def _edited_copy(src, dst, config=None, extra_token=None):
    """A copy of the draft at src with config.json fields changed or a token added to its tokenizer."""
    shutil.copytree(src, dst)
    if config:
        cfg = json.loads((dst / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps(cfg | config))
    if extra_token:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(dst)
        tokenizer.add_tokens([extra_token])
        tokenizer.save_pretrained(dst)
    return dst


@pytest.mark.parametrize(("edit", "needle"), [
    (dict(config={"max_position_embeddings": 128}), "the draft model reaches 128 positions"),
    (dict(extra_token="<draft-only>"), "the draft model's tokenizer differs from the target's on 1 tokens"),
])
def test_a_draft_that_does_not_fit_the_target_is_a_profile_error(tiny_llama_dir, tiny_draft_dir, tmp_path, edit,
                                                                 needle):
    draft = _draft(_edited_copy(tiny_draft_dir, tmp_path / "draft", **edit))
    with pytest.raises(ProfileError, match=needle):
        make_engine(tiny_llama_dir, draft=draft, **DRAFT)


def test_a_draft_with_another_vocabulary_size_is_a_profile_error(tiny_llama_dir, tmp_path):
    import transformers

    from tests.conftest import TINY_COMMON

    out = tmp_path / "small-vocab"
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY_COMMON | {"vocab_size": 300})).save_pretrained(out)
    transformers.AutoTokenizer.from_pretrained(tiny_llama_dir).save_pretrained(out)
    with pytest.raises(ProfileError, match="vocabulary has 300 entries and the target's 320"):
        make_engine(tiny_llama_dir, draft=_draft(out), **DRAFT)


def test_a_gptq_target_runs_a_float_draft_quantized_to_int4(cpu_kernel_ops, tmp_path):
    """The checkpoint's format loads only packed layers; a float draft beside it takes int4 (the same Q4_1 blocks)."""
    from inferplug.quant.block_linear import BlockLinear
    from tests.quant_fixtures import fixture_dir, float_model

    target, draft = fixture_dir("gptq-actorder-g32"), tmp_path / "draft"
    float_model("gptq-actorder-g32").save_pretrained(draft)  # the target's own weights, dequantized: a draft that agrees
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(target / name, draft / name)
    path = tmp_path / "gptq-draft.toml"
    path.write_text(f'backend = "native"\n[model]\npath = "{target}"\n[quantization]\nformat = "gptq"\n'
                    f'[cache]\nmemory = "8MiB"\n[speculative]\nmethod = "draft"\nnum_tokens = 3\n'
                    f'[speculative.draft_model]\npath = "{draft}"\n')
    profile = load_profile(path)
    hardware = Hardware(cpu_flags=frozenset({"avx2", "fma", "f16c"}), cpu_count=2, ram_total=8 << 30,
                        ram_available=4 << 30, packages=frozenset({"torch", "transformers"}))
    engine = build_engine(profile, resolve(profile, hardware))
    assert isinstance(engine.proposer.runner.model.layers[0].qkv, BlockLinear)
    events = run_all(engine, [Request(prompt=prompts_of([9])[0], request_id="r", params=greedy(12))])
    assert len(tokens_of(events["r"])) == 12 and engine.stats()["spec_accepted_tokens"] > 0
