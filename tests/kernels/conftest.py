"""Without a GPU, Triton kernels run in its interpreter (must be set before triton is imported)."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
