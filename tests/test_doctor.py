"""`inferplug doctor` with injected hardware: backends usable or why not, profiles fit or why not,
and a non-zero exit when nothing can run."""

from __future__ import annotations

import json
import sys

import pytest

from inferplug import doctor
from inferplug.hardware import GPU, Hardware

PACKAGES = frozenset({"torch", "transformers", "ctranslate2", "httpx"})
CPU_ONLY = Hardware(cpu_model="test cpu", cpu_flags=frozenset({"avx2", "avx512f", "avx512_bf16"}), cpu_count=4,
                    ram_total=32 << 30, ram_available=24 << 30, packages=PACKAGES)
NOTHING = Hardware(cpu_flags=frozenset(), ram_total=8 << 30, ram_available=4 << 30, packages=frozenset())


def test_backends_on_a_cpu_machine():
    status = doctor.backend_status(CPU_ONLY)
    assert status["native"] == {"usable": True, "why": "usable on cpu"}
    assert status["ctranslate2"]["usable"] is True
    assert status["exllamav2"]["usable"] is False
    assert status["exllamav2"]["why"].startswith("needs a CUDA GPU; none found")
    assert "exllamav2" not in sys.modules  # checked with find_spec, never imported


def test_backends_with_a_gpu_but_no_exllamav2():
    hw = Hardware(gpus=(GPU(0, "test gpu", (8, 6), 24 << 30, 20 << 30),), packages=PACKAGES)
    status = doctor.backend_status(hw)
    assert status["native"]["why"] == "usable on cuda"
    assert status["exllamav2"]["why"] == "exllamav2 is not installed (pip install 'inferplug[exllamav2]')"


def test_profiles_without_downloads(monkeypatch, tmp_path):
    monkeypatch.setenv("INFERPLUG_HOME", str(tmp_path))  # nothing pulled
    rows = {row["name"]: row for row in doctor.profile_status(CPU_ONLY)}
    assert rows["smollm2-135m"]["fits"] is None and "inferplug pull smollm2-135m" in rows["smollm2-135m"]["why"]
    assert (rows["zephyr-awq"]["fits"], rows["zephyr-awq"]["backend"], rows["zephyr-awq"]["weights"]) == (True, "native", "awq")
    # an auto KV cache on the CPU holds one context of the default 4096 tokens: 1 GiB at 256 KiB a token (fp32)
    assert (rows["zephyr-awq"]["max_model_len"], rows["zephyr-awq"]["seqs_at_full_context"]) == (4096, 1)
    assert "KV cache 1.00 GiB (4096 tokens, auto: one full context)" in rows["zephyr-awq"]["why"]
    assert rows["openai-remote"]["fits"] is True


@pytest.mark.smollm2
def test_default_profile_fits_with_context_and_batch(smollm2_gguf):
    report = doctor.collect(CPU_ONLY)
    row = next(r for r in report["profiles"] if r["name"] == "smollm2-135m")
    assert (row["fits"], row["backend"], row["device"], row["dtype"]) == (True, "native", "cpu", "float32")
    assert row["max_model_len"] == 4096 and row["seqs_at_full_context"] == 5  # the default context, in its "1GiB"
    assert "(23296 tokens, cache.memory = '1GiB')" in row["why"]
    assert report["ok"] is True
    assert report["machine"]["isa"] == ["AVX2", "AVX-512", "AVX512-BF16"]


def test_nothing_can_run_exits_non_zero(monkeypatch, capsys):
    monkeypatch.setattr(doctor, "probe", lambda: NOTHING)
    assert doctor.run_doctor(as_json=True) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False
    assert not any(b["usable"] for b in report["backends"].values())
    assert doctor.run_doctor() == 1
    assert "nothing can run here" in capsys.readouterr().out


def test_probe_reads_this_machine_without_importing_heavy_packages():
    from inferplug.hardware import nvidia_driver_present, probe

    heavy = {"torch", "ctranslate2", "exllamav2", "transformers"}
    already = heavy & set(sys.modules)
    hw = probe()
    assert hw.cpu_count >= 1 and hw.ram_total >= hw.ram_available > 0
    assert "torch" in hw.packages  # found with find_spec
    if not nvidia_driver_present():
        assert hw.gpus == () and (heavy & set(sys.modules)) == already


def test_cgroup_v2_memory_limit(tmp_path):
    from inferplug.hardware import _cgroup_memory_limit

    (tmp_path / "memory.max").write_text("4294967296\n")
    (tmp_path / "memory.current").write_text("1073741824\n")
    assert _cgroup_memory_limit(tmp_path) == (4 << 30, 3 << 30)
    (tmp_path / "memory.max").write_text("max\n")
    assert _cgroup_memory_limit(tmp_path) is None
    assert _cgroup_memory_limit(tmp_path / "absent") is None


def test_bandwidth_bound_for_each_fitting_profile(monkeypatch, tmp_path):
    monkeypatch.setenv("INFERPLUG_HOME", str(tmp_path))
    rows = doctor.profile_status(CPU_ONLY)
    doctor.add_bandwidth_bounds(rows, 20e9)  # 20 GB/s
    zephyr = next(r for r in rows if r["name"] == "zephyr-awq")
    assert zephyr["bandwidth_bound_tokens_per_s"] == pytest.approx(20e9 / zephyr["weights_bytes"])
    assert 3 < zephyr["bandwidth_bound_tokens_per_s"] < 5  # ~4.7 GiB of weights a step
    assert all("bandwidth_bound_tokens_per_s" not in r for r in rows if not r["fits"])


def test_tensor_parallel_line_says_gloo_on_the_cpu_nccl_over_gpus_off_without_torch():
    from inferplug.parallel_plan import doctor_line

    assert doctor_line(CPU_ONLY).startswith("native engine on the CPU over gloo: ranks share the 4 cores")
    two = Hardware(gpus=(GPU(0, "a", (9, 0), 80 << 30, 70 << 30), GPU(1, "b", (9, 0), 80 << 30, 70 << 30)),
                   packages=PACKAGES)
    assert doctor_line(two).startswith("native engine, up to 2 ranks over NCCL")
    assert doctor_line(NOTHING).startswith("off: the native engine needs torch")


def test_ray_installed_local_or_reachable(monkeypatch):
    import socket

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert doctor.ray_status(CPU_ONLY)["why"].startswith("not installed") and "inferplug[ray]" in \
        doctor.ray_status(CPU_ONLY)["why"]
    with_ray = Hardware(packages=PACKAGES | {"ray"})
    assert "starts a local Ray" in doctor.ray_status(with_ray)["why"]
    with socket.socket() as listening:  # a port that answers, then one that does not
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{listening.getsockname()[1]}")
        assert doctor.ray_status(with_ray)["reachable"] is True
    status = doctor.ray_status(with_ray)
    assert status["reachable"] is False and "cannot reach the Ray cluster" in status["why"]


@pytest.mark.parametrize("setting, shown", [
    ("always [madvise] never\n", "on for mapped weights and KV pools (transparent_hugepage: madvise)"),
    ("[always] madvise never\n", "on for mapped weights and KV pools (transparent_hugepage: always)"),
    ("always madvise [never]\n", "off (transparent_hugepage: never)"),
])
def test_huge_pages_line_reads_the_kernel_setting_and_names_the_fix(tmp_path, setting, shown):
    from inferplug.models import huge_pages

    sysfs = tmp_path / "enabled"
    sysfs.write_text(setting)
    line = huge_pages.status(str(sysfs))
    assert line.startswith(shown)
    assert ("echo madvise > " + str(sysfs) in line) == ("[never]" in setting)
    assert huge_pages.status(str(tmp_path / "absent")) is None  # no such setting: no line
