"""ops.kernel_set, the one decision of which kernel set runs a native model's attention, KV store, RoPE and norms:
the names it answers are the ops sets select_ops builds, each pin is checked, and the old names warn."""

from __future__ import annotations

import typing
import warnings

import pytest
import torch

from inferplug.errors import InferPlugDeprecationWarning, ProfileError
from inferplug.ops import TorchOps, select_ops
from inferplug.ops.kernel_set import ATTENTION_CHOICES, OLD_ATTENTION, kernel_set
from inferplug.profile_schema import Profile
from tests.resolver_hardware import ALL_CPU_PACKAGES, cpu

KERNELS_CPU = cpu(flags=("avx2", "fma", "f16c"))


@pytest.fixture(autouse=True)
def kernels_on(monkeypatch):
    monkeypatch.delenv("INFERPLUG_NO_CPU_KERNELS", raising=False)


def test_the_profile_accepts_what_kernel_set_decides_and_nothing_else():
    assert typing.get_args(Profile.model_fields["attention"].annotation) == ATTENTION_CHOICES + OLD_ATTENTION


def test_auto_names_what_runs_for_each_device_dtype_and_pool():
    assert kernel_set("auto", "cpu", "float32", None, KERNELS_CPU) == "cpu-kernels"
    assert kernel_set("auto", "cpu", "float32", "float16", KERNELS_CPU) == "cpu-kernels"
    assert kernel_set("auto", "cpu", "float32", "bfloat16", KERNELS_CPU) == "torch"  # pools the kernels cannot read
    assert kernel_set("auto", "cpu", "bfloat16", None, KERNELS_CPU) == "torch"  # they compute in fp32
    assert kernel_set("auto", "cpu", "float32", None, cpu()) == "torch"  # no F16C
    assert kernel_set("auto", "cuda", "bfloat16", None, cpu(packages=ALL_CPU_PACKAGES | {"triton"})) == "triton"
    assert kernel_set("auto", "cuda", "bfloat16", None, cpu()) == "torch"  # no triton


def test_a_pin_that_cannot_run_says_why_and_the_way_out():
    with pytest.raises(ProfileError, match="'cpu-kernels' cannot run here: they compute in float32, and dtype is "
                                           "bfloat16; use attention = 'auto' or 'torch'"):
        kernel_set("cpu-kernels", "cpu", "bfloat16", None, KERNELS_CPU)
    with pytest.raises(ProfileError, match="'cpu-kernels' cannot run here: the CPU lacks f16c"):
        kernel_set("cpu-kernels", "cpu", "float32", None, cpu())
    with pytest.raises(ProfileError, match="'triton' needs a CUDA GPU"):
        kernel_set("triton", "cpu", "float32", None, KERNELS_CPU)
    with pytest.raises(ProfileError, match="'flash' needs the flash-attn package"):
        kernel_set("flash", "cuda", "bfloat16", None, cpu(packages=ALL_CPU_PACKAGES | {"triton"}))
    with pytest.raises(ProfileError, match="use one of auto, cpu-kernels, torch, triton, flash"):
        kernel_set("xformers", "cpu", "float32", None, KERNELS_CPU)


def test_torch_is_torch_and_warns_only_where_it_used_to_mean_the_kernels():
    with pytest.warns(InferPlugDeprecationWarning, match="now runs torch's own attention.*'cpu-kernels'"):
        assert kernel_set("torch", "cpu", "float32", None, KERNELS_CPU) == "torch"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert kernel_set("torch", "cpu", "float32", None, cpu()) == "torch"  # it ran torch here before too
        assert kernel_set("torch", "cuda", "bfloat16", None, cpu()) == "torch"


def test_select_ops_builds_the_set_it_was_told(cpu_kernel_ops):
    args = (torch.device("cpu"), torch.float32, torch.float16, 64)
    assert select_ops("cpu-kernels", *args).name == "cpu-kernels"
    with pytest.warns(InferPlugDeprecationWarning):
        torch_ops = select_ops("torch", *args)
    assert type(torch_ops) is TorchOps
    with pytest.warns(InferPlugDeprecationWarning, match="'sdpa' is renamed: here it runs 'cpu-kernels'"):
        assert select_ops("sdpa", *args).name == "cpu-kernels"
