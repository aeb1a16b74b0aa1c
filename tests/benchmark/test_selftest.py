"""`inferplug doctor --bench`: the self-test measures, derives the model's limits and runs the engine."""

import pytest

from inferplug import selftest


def test_measurements_are_positive_rates():
    assert selftest.matmul_flops("float32", seconds=0.05, max_size=256) > 0
    assert selftest.memory_bandwidth(seconds=0.05, mib=8) > 0


def test_run_reports_limits_and_engine_speeds(tiny_profile, capsys):
    report = selftest.run(profile=tiny_profile, seconds=0.5)
    assert "engine_error" not in report
    assert set(report["matmul_flops"]) == {"float32", "bfloat16"}
    assert report["dtype"] == "float32" and report["backend"] == "native"
    params = report["parameters"]
    assert report["compute_bound_tokens_per_s"] == pytest.approx(report["matmul_flops"]["float32"] / (2 * params))
    assert report["bandwidth_bound_tokens_per_s"] == pytest.approx(report["memory_bandwidth_bytes_per_s"] / (4 * params))
    assert report["prefill_tokens_per_s"] > 0 and report["decode_tokens_per_s"] > 0
    assert "bandwidth-bound limit" in capsys.readouterr().out


def test_a_profile_that_cannot_load_is_reported_not_raised(tmp_path):
    broken = tmp_path / "broken.toml"
    broken.write_text('name = "broken"\n[model]\npath = "/nonexistent/model.gguf"\n')
    report = selftest.run(profile=str(broken), seconds=0.2, print_report=False)
    assert "nonexistent" in report["engine_error"] and report["memory_bandwidth_bytes_per_s"] > 0
