"""The kernel sets (AVX2, AVX-512 + VNNI): choosing one, the same integer results from each, float results
within their rounding bound, and a row's result independent of the rows beside it on each."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from inferplug.kernels import cpu as cpu_kernels
from inferplug.errors import ProfileError
from inferplug.hardware import Hardware
from inferplug.quant.block_linear import Q4G128Linear, Q4Linear, Q8HeadLinear, Q8Linear
from inferplug.quant.kquant_linear import Q4KLinear, Q5_0Linear, Q5KLinear, Q6KHeadLinear, Q6KLinear
from inferplug.kernels.paged_attention_ref import random_pool

AVX2_ONLY = Hardware(cpu_flags=frozenset({"avx2", "fma", "f16c"}))
EVERY_FLAG = Hardware(cpu_flags=frozenset().union(*cpu_kernels.KERNEL_SETS.values()))


@pytest.fixture
def both_isas(ops):
    if cpu_kernels.supported_isas() != ["avx2", "avx512"]:
        pytest.skip("this CPU runs one kernel set only")
    return ops


def test_the_env_var_picks_a_set_the_cpu_has(monkeypatch):
    monkeypatch.delenv(cpu_kernels.ISA_ENV, raising=False)
    assert cpu_kernels.chosen_isa(EVERY_FLAG) == "avx512" and cpu_kernels.chosen_isa(AVX2_ONLY) == "avx2"
    monkeypatch.setenv(cpu_kernels.ISA_ENV, "avx2")
    assert cpu_kernels.chosen_isa(EVERY_FLAG) == "avx2"


@pytest.mark.parametrize("value,message", [("avx512", "lacks avx512_vnni, avx512bw"), ("sse4", "not a kernel set")])
def test_the_env_var_asking_for_what_the_cpu_lacks_is_a_clear_error(monkeypatch, value, message):
    monkeypatch.setenv(cpu_kernels.ISA_ENV, value)
    with pytest.raises(ProfileError, match=message):
        cpu_kernels.chosen_isa(AVX2_ONLY)


AVX512_CODE = re.compile(r"zmm|%k[0-7]|[xy]mm(1[6-9]|2[0-9]|3[01])\b|vpdpbusd|\{1to")


@pytest.mark.skipif(not (shutil.which("objdump") and shutil.which("nm")), reason="needs binutils' objdump and nm")
def test_avx512_code_stays_in_its_own_translation_unit(ops):
    """An AVX2 host must never run an AVX-512 instruction: only isa_avx512.o holds any, it exports only
    avx512() (reached after the CPU check) and no weak symbol the linker could take over another file's copy."""
    from torch.utils.cpp_extension import _get_build_directory

    objects = sorted(Path(_get_build_directory("inferplug_cpu_kernels", False)).glob("*.o"))
    assert any(o.name == "isa_avx512.o" for o in objects)
    for obj in objects:
        code = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(obj)], capture_output=True, text=True, check=True).stdout
        if obj.name != "isa_avx512.o":
            assert not AVX512_CODE.search(code), f"{obj.name} holds AVX-512 code"
    symbols = subprocess.run(["nm", "-C", "--defined-only", str(objects[0].with_name("isa_avx512.o"))],
                             capture_output=True, text=True, check=True).stdout.splitlines()
    exported = [line.split(" ", 2)[2] for line in symbols if line.split(" ")[1] in "TDBRWVu"]
    # Past the one entry point: at most the hidden pointer to the C++ unwinder's routine, data that is the same
    # 8 bytes in every object that has it.
    assert [name for name in exported if name != "DW.ref.__gxx_personality_v0"] == ["inferplug_isa::avx512()"]


def test_isa_names_the_set_that_runs(both_isas):
    for name, label in (("avx2", "avx2"), ("avx512", "avx512-vnni")):
        cpu_kernels.set_isa(name)
        assert cpu_kernels.isa() == label


@pytest.mark.parametrize("layer_cls,width", [(cls, width) for cls in (Q4Linear, Q5_0Linear, Q8Linear, Q8HeadLinear)
                                             for width in (32, 96, 288, 576, 1536)]
                         + [(Q4KLinear, width) for width in (256, 768, 1536)]
                         + [(Q4G128Linear, width) for width in (128, 384, 1536)]
                         + [(cls, width) for cls in (Q5KLinear, Q6KLinear, Q6KHeadLinear) for width in (256, 768, 1536)])  # 1 to 48 blocks: short groups, runs
def test_integer_kernels_are_bit_identical_across_sets(both_isas, layer_cls, width):
    """Exact integer dot products and the same float order (8 lanes in every set): the same bits."""
    gen = torch.Generator().manual_seed(width)
    layer = layer_cls.from_float(torch.randn(40, width, generator=gen))
    x = torch.randn(64, width, generator=gen)
    for rows in (1, 3, 4, 5, 16, 64):
        outs = []
        for isa in ("avx2", "avx512"):
            cpu_kernels.set_isa(isa)
            outs.append(layer(x[:rows]))
        assert torch.equal(*outs), f"{rows} rows"


def test_rows_do_not_depend_on_their_batch(ops):
    """Row i alone and row i among M rows, M = 1..64: the same bits, for every matmul and paged decode."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 576, generator=gen)
    for layer_cls in (Q4Linear, Q8Linear, Q8HeadLinear):  # the head's two parts of 1..64 rows: 2..128 kernel rows
        layer = layer_cls.from_float(torch.randn(72, 576, generator=gen))
        alone = torch.cat([layer(x[i:i + 1]) for i in range(64)])
        for rows in range(1, 65):
            assert torch.equal(layer(x[:rows]), alone[:rows]), f"{layer_cls.__name__}, {rows} rows"

    lengths = [1 + (37 * i) % 200 for i in range(64)]
    q, k_cache, v_cache, tables, lens = random_pool(batch=64, heads=9, kv_heads=3, head_dim=64, block_size=16,
                                                    seq_lens=lengths)
    tables, lens = tables.long(), lens.long()
    alone = torch.cat([ops.paged_decode(q[i:i + 1], k_cache, v_cache, tables[i:i + 1], lens[i:i + 1], 0.125)
                       for i in range(64)])
    for rows in range(1, 65):
        out = ops.paged_decode(q[:rows], k_cache, v_cache, tables[:rows], lens[:rows], 0.125)
        assert torch.equal(out, alone[:rows]), f"paged_decode, {rows} rows"


@pytest.mark.parametrize("layer_cls", [Q4Linear, Q4KLinear, Q4G128Linear, Q5_0Linear, Q5KLinear, Q6KLinear, Q8Linear,
                                       Q8HeadLinear])
def test_rows_keep_their_bits_when_x_comes_in_chunks(ops, layer_cls):
    """At 7B's widths several rows take x in L1-sized chunks (quant_dot.h, by_passes; one row takes it whole):
    each sum keeps its order, so a row alone and among 2..8 rows give the same bits, on every set the CPU has."""
    gen = torch.Generator().manual_seed(1)
    width = 14592  # 456 blocks: 7 chunks of int8 x at 8 rows and a part, a last run of 8 blocks; the head's float x in 29
    layer = layer_cls.from_float(torch.randn(40, width, generator=gen))
    x = torch.randn(8, width, generator=gen)
    for isa in cpu_kernels.supported_isas():
        cpu_kernels.set_isa(isa)
        alone = torch.cat([layer(x[i:i + 1]) for i in range(8)])
        for rows in (2, 3, 5, 8):
            assert torch.equal(layer(x[:rows]), alone[:rows]), f"{isa}, {rows} rows"


def gamma(n: int) -> float:
    """Higham's bound on the relative error of an n-term float32 sum or dot product: n u / (1 - n u)."""
    return n * 2.0**-24 / (1 - n * 2.0**-24)


@pytest.mark.parametrize("sharpness", [1.0, 40.0])
def test_paged_decode_within_its_rounding_bound(ops, sharpness):
    """Each set sums scores and values in its own order (8 or 16 lanes). Against float64: a score is off by
    at most E = gamma(D + 1) * scale * sum|q k|, which scales the softmax weights by at most e^(2E); the
    exp polynomial (~1 ulp), the normalisation and the weighted sum of L values add gamma(L + 8) and
    gamma(L) relative to W = sum p |v|. So |out - exact| <= 1.1 * (2 E + 2 gamma(L + 8)) * W (1.1: the
    second-order terms)."""
    heads, kv_heads, d, block_size = 9, 3, 64, 16
    q, k_cache, v_cache, tables, lens = random_pool(batch=4, heads=heads, kv_heads=kv_heads, head_dim=d,
                                                    block_size=block_size, seq_lens=[1, 16, 50, 300], seed=2)
    q, scale = q * sharpness, d**-0.5
    out = ops.paged_decode(q, k_cache, v_cache, tables.long(), lens.long(), scale).double()
    for b, length in enumerate(lens.tolist()):
        blocks = tables[b, : (length + block_size - 1) // block_size].long()
        keys, values = (c[:, blocks].reshape(kv_heads, -1, d)[:, :length].double().repeat_interleave(heads // kv_heads, 0)
                        for c in (k_cache, v_cache))  # [heads, L, D]
        products = q[b].double()[:, None, :] * keys
        p = (products.sum(-1) * scale).softmax(-1)
        exact = (p[..., None] * values).sum(1)
        score_error = gamma(d + 1) * scale * products.abs().sum(-1).amax(-1, keepdim=True)
        bound = 1.1 * (2 * score_error + 2 * gamma(length + 8)) * (p[..., None] * values.abs()).sum(1)
        assert ((out[b] - exact).abs() <= bound).all(), f"sequence {b} of {length} tokens"
