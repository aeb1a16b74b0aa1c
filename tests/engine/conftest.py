"""The engine tests' shared reference model (every engine's leak check is tests/conftest.py's)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_gguf):
    """HF transformers' SmolLM2 from the same GGUF file, in fp32: the reference our engine answers like."""
    import torch
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        smollm2_gguf.parent, gguf_file=smollm2_gguf.name, dtype=torch.float32).eval()
