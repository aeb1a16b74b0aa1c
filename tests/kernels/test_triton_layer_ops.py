"""The Triton layer kernels (KV store, RMSNorm + residual, RoPE) against their pure-torch references
(inferplug/kernels/layer_ops_ref.py), and the references against the engine's torch ops."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inferplug.kernels.layer_ops_ref import add_rms_norm_ref, rope_ref, store_kv_ref
from inferplug.ops.attention import write_kv
from inferplug.ops.torch_ops import TorchOps, apply_rope

from inferplug.kernels.layer_ops import add_rms_norm, rope_, store_kv  # imports triton; conftest set the interpreter
from tests.kernels.kernel_checks import relative_error

DTYPES = [torch.float32, torch.float16]  # bf16 on CUDA only: the interpreter's bf16 is its raw bits


def _rows(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kv_heads,head_dim,block_size", [(1, 64, 16), (3, 128, 4), (8, 64, 16)])
def test_store_kv_writes_each_slot_and_skips_minus_one(dtype, kv_heads, head_dim, block_size):
    blocks = 6
    k_cache, v_cache = (_rows(kv_heads, blocks, block_size, head_dim, dtype=dtype, seed=s) for s in (1, 2))
    slots = torch.randperm(blocks * block_size, generator=torch.Generator().manual_seed(3))[:17]  # 15, 16, 17: edges
    slots[[4, 9]] = -1
    k, v = _rows(17, kv_heads, head_dim, dtype=dtype, seed=4), _rows(17, kv_heads, head_dim, dtype=dtype, seed=5)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    store_kv_ref(expected_k, expected_v, k, v, slots)
    store_kv(k_cache, v_cache, k, v, slots)
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)  # untouched slots stay as they were


def test_store_kv_reads_strided_rows_into_a_narrower_pool():
    qkv = _rows(5, 4 + 2 + 2, 16)  # q, k and v heads side by side, as the model's qkv projection gives them
    k, v = qkv[:, 4:6], qkv[:, 6:]
    k_cache, v_cache = torch.zeros(2, 3, 4, 16, dtype=torch.float16), torch.zeros(2, 3, 4, 16, dtype=torch.float16)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    slots = torch.tensor([3, 4, 11, 0, 7])
    store_kv_ref(expected_k, expected_v, k, v, slots)
    store_kv(k_cache, v_cache, k, v, slots)
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)
    torch_k, torch_v = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
    write_kv(torch_k, torch_v, k, v, slots)  # the torch path stores the same cast
    assert torch.equal(torch_k, expected_k) and torch.equal(torch_v, expected_v)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_delta", [True, False])
def test_add_rms_norm_matches_an_fp64_reference(poisoned_buffers, dtype, with_delta):
    x, delta, weight = _rows(17, 96, dtype=dtype), _rows(17, 96, dtype=dtype, seed=1), _rows(96, dtype=dtype, seed=2)
    expected_x = x.clone()
    expected = add_rms_norm_ref(expected_x, delta if with_delta else None, weight, 1e-5)
    exact = add_rms_norm_ref(x.double(), delta.double() if with_delta else None, weight.double(), 1e-5)
    got = add_rms_norm(x, delta if with_delta else None, weight, 1e-5)
    assert torch.equal(x, expected_x)  # the residual, added in place and rounded as torch rounds it
    assert relative_error(got, exact) < (1e-6 if dtype == torch.float32 else 2e-3)
    torch.testing.assert_close(got, expected)


def test_rms_norm_reference_is_the_torch_ops():
    x, delta, weight = _rows(5, 32), _rows(5, 32, seed=1), _rows(32, seed=2)
    ops_x = x.clone()
    torch.testing.assert_close(add_rms_norm_ref(x, delta, weight, 1e-6), TorchOps().add_rms_norm(ops_x, delta, weight, 1e-6))
    torch.testing.assert_close(x, ops_x)
    torch.testing.assert_close(F.rms_norm(x, (32,), weight, 1e-6), add_rms_norm_ref(x.clone(), None, weight, 1e-6))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,head_dim", [(3, 64), (12, 128)])
def test_rope_in_place_matches_the_reference(dtype, heads, head_dim):
    positions = torch.tensor([0, 1, 15, 16, 17, 300, 7])
    angles = torch.outer(torch.arange(400.0), 10000 ** (-torch.arange(0, head_dim, 2) / head_dim))
    cos = torch.cat([angles, angles], dim=-1).cos()
    signed_sin = torch.cat([-angles.sin(), angles.sin()], dim=-1)
    qkv = _rows(7, heads + 2, head_dim, dtype=dtype)  # the last two heads (v) stay as they are
    qk = qkv[:, :heads]
    original = qk.clone()
    expected = rope_ref(original, positions, cos, signed_sin)
    exact = rope_ref(qk.double(), positions, cos.double(), signed_sin.double())
    v_before = qkv[:, heads:].clone()
    rope_(qk, positions, cos, signed_sin)
    assert relative_error(qk, exact) < (1e-6 if dtype == torch.float32 else 2e-3)
    torch.testing.assert_close(qk, expected)
    assert torch.equal(qkv[:, heads:], v_before)
    rows = cos[positions].to(dtype)[:, None], signed_sin[positions].to(dtype)[:, None]
    assert torch.equal(apply_rope(original, *rows), expected)  # the torch path rounds the same way


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_layer_kernels_in_bf16_on_cuda(poisoned_buffers):
    x, delta, weight = (_rows(*s, dtype=torch.bfloat16, seed=i).cuda() for i, s in enumerate([(9, 4096), (9, 4096), (4096,)]))
    exact = add_rms_norm_ref(x.double(), delta.double(), weight.double(), 1e-5)
    assert relative_error(add_rms_norm(x, delta, weight, 1e-5), exact) < 1e-2
    k_cache = torch.zeros(8, 4, 16, 128, dtype=torch.float8_e4m3fn, device="cuda")
    v_cache = torch.zeros_like(k_cache)
    k, v = _rows(5, 8, 128, dtype=torch.bfloat16).cuda(), _rows(5, 8, 128, dtype=torch.bfloat16, seed=1).cuda()
    slots = torch.tensor([0, 17, -1, 63, 5], device="cuda")
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    store_kv_ref(expected_k, expected_v, k, v, slots)
    store_kv(k_cache, v_cache, k, v, slots)  # fp8 pools: a scale-free cast
    assert torch.equal(k_cache.view(torch.uint8), expected_k.view(torch.uint8))
