"""Every kernel source of the engine, each with a pure-torch reference beside it:

- `cpu/`: C++ kernels for x86 CPUs (AVX2, AVX-512 + VNNI), built on first use and registered as torch ops;
- `paged_attention.py`: Triton kernels for CUDA (`paged_attention_ref.py` is their specification).

Nothing here is imported until a model that runs it is built (torch, triton and the compiler stay lazy).
"""
