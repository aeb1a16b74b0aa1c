"""Every kernel source of the engine, each with a pure-torch reference beside it:

- `cpu/`: C++ kernels for x86 CPUs (AVX2, AVX-512 + VNNI), built on first use and registered as torch ops;
- Triton kernels for CUDA, each with its specification beside it (`*_ref.py`): `paged_attention.py` (paged
  decode, split-K), `prefill_attention.py` (prefill and chunked prefill through block tables, packed with
  cu_seqlens), `layer_ops.py` (KV store through the slot mapping, RMSNorm + residual, RoPE in place),
  `moe_gemm.py` (an MoE layer's grouped expert GEMM: every selected expert in one launch, float or MXFP4 experts),
  `delta_rule.py` (Gated DeltaNet's chunked delta rule over a prompt's rows). Both attention kernels,
  and the C++ one, take a sliding window (Gemma 3's local layers).

Nothing here is imported until a model that runs it is built (torch, triton and the compiler stay lazy).
"""
