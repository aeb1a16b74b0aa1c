"""Triton kernels, each with a pure-torch reference beside it (imported only where a kernel runs)."""
