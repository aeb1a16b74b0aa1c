"""Kernel test fixtures (tests/conftest.py puts Triton in its interpreter where there is no GPU)."""

import pytest
import torch


@pytest.fixture
def poisoned_buffers(monkeypatch):
    """Every buffer a kernel wrapper allocates (outputs, split-K partials) starts as NaN, so an element the
    kernels leave unwritten, or a partial read that nobody wrote, shows up in the result."""
    real_empty = torch.empty

    def poisoned(*shape, **kw):
        return real_empty(*shape, **kw).fill_(float("nan"))

    monkeypatch.setattr(torch, "empty", poisoned)
    monkeypatch.setattr(torch, "empty_like", lambda t: poisoned(t.shape, dtype=t.dtype, device=t.device))
