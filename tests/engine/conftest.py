"""Every engine a test makes must end with its pool fully free and no request left behind."""

from __future__ import annotations

import pytest

from tests.engine.engine_helpers import made_engines


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_gguf):
    """HF transformers' SmolLM2 from the same GGUF file, in fp32: the reference our engine answers like."""
    import torch
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        smollm2_gguf.parent, gguf_file=smollm2_gguf.name, dtype=torch.float32).eval()


@pytest.fixture(autouse=True)
def pool_is_free_after_test():
    made_engines.clear()
    yield
    for engine in made_engines:
        assert not engine.has_unfinished(), "requests left unfinished"
        for pool in engine.kv_pools:  # the target's, and a draft model's
            pool.check_invariants()
            assert pool.num_free == pool.num_blocks, "blocks leaked"
    made_engines.clear()


