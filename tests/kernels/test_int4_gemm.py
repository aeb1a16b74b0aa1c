"""The Triton int4 group-wise dequant-GEMM (kernels/int4_gemm.py) against its torch reference, under the
interpreter on a CPU (conftest.py), for odd shapes and every group size the loaders accept."""

from __future__ import annotations

import pytest
import torch

from inferplug.kernels.int4_gemm_ref import dequantize, int4_gemm_ref, pack_rows, unpack_rows

from inferplug.kernels.int4_gemm import int4_gemm  # imports triton; conftest set the interpreter first


def random_layer(k: int, n: int, group: int, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (k, n), generator=gen, dtype=torch.uint8)
    scales = (torch.rand(k // group, n, generator=gen) * 0.02 + 0.001).to(dtype)
    zeros = torch.randint(0, 16, (k // group, n), generator=gen, dtype=torch.uint8)
    return pack_rows(codes), scales, zeros, codes


def test_pack_rows_round_trips():
    _, _, _, codes = random_layer(64, 24, 32, torch.float32)
    assert torch.equal(unpack_rows(pack_rows(codes)), codes)


@pytest.mark.parametrize("m,k,n,group", [(1, 32, 8, 32), (5, 96, 72, 32), (17, 128, 130, 64), (3, 384, 65, 128)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_kernel_matches_reference(m, k, n, group, dtype):
    qweight, scales, zeros, codes = random_layer(k, n, group, dtype)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(1)).to(dtype)
    expected = int4_gemm_ref(x, qweight, scales, zeros, group)
    got = int4_gemm(x, qweight, scales, zeros, group)
    tol = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3)}[dtype]
    torch.testing.assert_close(got, expected, rtol=tol[0], atol=tol[1])


def test_reference_dequantizes_as_its_layout_says():
    qweight, scales, zeros, codes = random_layer(64, 8, 32, torch.float32)
    groups = torch.arange(64) // 32
    assert torch.equal(dequantize(qweight, scales, zeros, 32), (codes.float() - zeros[groups].float()) * scales[groups])


def test_rows_do_not_depend_on_the_batch():
    qweight, scales, zeros, _ = random_layer(128, 64, 32, torch.float32)
    x = torch.randn(20, 128, generator=torch.Generator().manual_seed(2))
    assert torch.equal(int4_gemm(x, qweight, scales, zeros, 32)[3:4], int4_gemm(x[3:4], qweight, scales, zeros, 32))
