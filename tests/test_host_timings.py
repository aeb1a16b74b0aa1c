"""Kernel paths chosen by timing them on the host that runs them (host_timings.py, compute_path_plan.prefill_gemm):
the most accurate path the quality rule admits within 10% of the fastest wins, int8 never (it fails the rule), a
pin always; the timings are taken once per host key and remembered, and `resolve` shows them. The measurement is
replaced by timings the tests control (the real one is timed by `inferplug doctor --bench` and by the first resolve
on a host)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from inferplug import host_timings
from inferplug.compute_path_plan import PREFILL_RULE
from inferplug.hardware import probe
from inferplug.memory_plan import ModelFacts
from inferplug.profile import load_profile
from inferplug.quant.prefill_timing import time_paths
from inferplug.resolver import resolve

FACTS = ModelFacts(134_515_008, 30, 3, 64, 8192, "test", num_attention_heads=9, hidden_size=576)


@pytest.fixture
def timed(cpu_kernel_ops, monkeypatch, tmp_path):
    """This host, its timings replaced by `timed.costs` (seconds a path); `timed.calls` lists the measurements."""
    monkeypatch.setenv("INFERPLUG_HOME", str(tmp_path))
    state = SimpleNamespace(costs={}, calls=[])

    def measure(paths, threads, width):
        state.calls.append((paths, threads, width))
        return {path: state.costs[path] for path in paths}
    monkeypatch.setattr(host_timings, "_measure", measure)
    return state


def test_auto_takes_the_fastest_admitted_path_and_shows_the_timings(timed):
    timed.costs = {"float32": 0.030, "bfloat16": 0.045, "bfloat16-onednn": 0.012}
    plan = resolve(load_profile("smollm2-135m"), probe(), FACTS)
    assert plan.prefill_gemm == "bfloat16-onednn"
    reason = next(r for r in plan.reasons if r.startswith("prefill:"))
    assert "timed once on this host (bfloat16-onednn 12.0 ms, float32 30.0 ms, bfloat16 45.0 ms)" in reason
    assert "int8 is no candidate" in reason
    timed.costs = {"float32": 0.010, "bfloat16": 0.045, "bfloat16-onednn": 0.012}  # remembered: not timed again
    assert resolve(load_profile("smollm2-135m"), probe(), FACTS).prefill_gemm == "bfloat16-onednn"
    assert len(timed.calls) == 1 and timed.calls[0][0] == tuple(PREFILL_RULE) and timed.calls[0][2] == 576


def test_the_isa_flags_do_not_decide_where_a_timing_exists(timed, monkeypatch):
    """An AVX512_BF16 CPU whose bf16 kernel is slower than float32 (as on an AMX Xeon) runs float32."""
    timed.costs = {"float32": 0.020, "bfloat16": 0.025, "bfloat16-onednn": 0.030}
    hw = probe()
    hw = dataclasses.replace(hw, cpu_flags=hw.cpu_flags | {"avx512_bf16"})
    monkeypatch.setattr(host_timings, "this_cpu", lambda: (hw.cpu_model, hw.cpu_flags))  # this host, with the flag
    plan = resolve(load_profile("smollm2-135m"), hw, FACTS)
    assert plan.prefill_gemm == "float32" and len(timed.calls) == 1


@pytest.mark.parametrize(("costs", "chosen"), [((0.0089, 0.0086, 0.0737), "float32"),  # the AVX2 EPYC's timings
                                              ((0.0300, 0.0100, 0.0095), "bfloat16"),
                                              ((0.0300, 0.0120, 0.0100), "bfloat16-onednn")])
def test_a_less_accurate_path_must_win_by_more_than_noise(timed, costs, chosen):
    timed.costs = dict(zip(PREFILL_RULE, costs))
    assert resolve(load_profile("smollm2-135m"), probe(), FACTS).prefill_gemm == chosen


def test_int8_is_never_chosen_however_fast(timed):
    timed.costs = {"float32": 0.030, "bfloat16": 0.020, "bfloat16-onednn": 0.025, "int8": 0.001}
    assert resolve(load_profile("smollm2-135m"), probe(), FACTS).prefill_gemm == "bfloat16"
    assert "int8" not in timed.calls[0][0]


def test_a_pin_wins_and_times_nothing(timed):
    profile = load_profile("smollm2-135m")
    profile.native.prefill_gemm = "float32"
    timed.costs = {"float32": 0.9, "bfloat16": 0.1, "bfloat16-onednn": 0.1}
    plan = resolve(profile, probe(), FACTS)
    assert plan.prefill_gemm == "float32" and timed.calls == []
    assert any("[native] prefill_gemm = 'float32'" in r for r in plan.reasons)


def test_each_thread_count_and_width_is_timed_apart(timed):
    timed.costs = {"float32": 0.030, "bfloat16": 0.020, "bfloat16-onednn": 0.025}
    profile = load_profile("smollm2-135m")
    for threads in (1, 2, 1):
        profile.native.num_threads = threads
        resolve(profile, probe(), FACTS)
    resolve(profile, probe(), dataclasses.replace(FACTS, hidden_size=4096))
    assert [(threads, width) for _, threads, width in timed.calls] == [(1, 576), (2, 576), (1, 4096)]


def test_each_kernel_set_is_timed_apart(timed, monkeypatch):
    """INFERPLUG_CPU_ISA=avx2 runs the AVX2 kernels on an AVX-512 host: their timings are not the AVX-512 set's."""
    from inferplug.kernels import cpu as cpu_kernels

    if cpu_kernels.supported_isas() != ["avx2", "avx512"]:
        pytest.skip("this CPU runs one kernel set only")
    timed.costs = {"float32": 0.030, "bfloat16": 0.020, "bfloat16-onednn": 0.025}
    for isa in ("avx512", "avx2", "avx512"):
        monkeypatch.setenv(cpu_kernels.ISA_ENV, isa)
        resolve(load_profile("smollm2-135m"), probe(), FACTS)
    assert len(timed.calls) == 2


def test_another_hosts_facts_are_not_timed_here(timed):
    """A plan for hardware that is not this host (here a made-up CPU) keeps the ISA-flag choice, untimed."""
    hw = dataclasses.replace(probe(), cpu_model="some other cpu", cpu_flags=frozenset({"avx2", "fma", "f16c"}))
    plan = resolve(load_profile("smollm2-135m"), hw, FACTS)
    assert plan.prefill_gemm == "float32" and timed.calls == []
    assert any("auto, untimed" in r for r in plan.reasons)


def test_forget_times_again(timed):
    timed.costs = {"float32": 0.030, "bfloat16": 0.020, "bfloat16-onednn": 0.025}
    resolve(load_profile("smollm2-135m"), probe(), FACTS)
    host_timings.forget()
    resolve(load_profile("smollm2-135m"), probe(), FACTS)
    assert len(timed.calls) == 2


def test_time_paths_keeps_each_paths_best_call_under_the_threads_asked():
    """The measurement loop with a clock the test controls: each call of a path advances it by that path's cost
    (the first repeat of each is slower, as a cold call is); the warm-up is not counted."""
    import torch

    costs = {"a": [5.0, 3.0, 2.0, 2.5], "b": [9.0, 1.0, 1.5, 1.2]}  # warm-up, then 3 repeats
    now, seen_threads, current = [0.0], [], []

    def run(path):
        seen_threads.append(torch.get_num_threads())
        now[0] += costs[path].pop(0)
        current.append(path)

    before = torch.get_num_threads()
    assert time_paths(("a", "b"), run, threads=1, clock=lambda: now[0]) == {"a": 2.0, "b": 1.0}
    assert set(seen_threads) == {1} and torch.get_num_threads() == before
    assert current == ["a", "b", "a", "b", "a", "b", "a", "b"]  # interleaved
