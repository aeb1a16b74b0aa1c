"""bench/prefill.py's flags (the OpenVINO peer's among them), its per-round ratio table, and the OpenVINO peer's
failure report. None of it needs OpenVINO: CI has no OpenVINO venv."""

import sys

import pytest

from tests.benchmark.bench_helpers import load_bench

prefill = load_bench("prefill")


def rejected(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_:
        prefill.parse_args(list(argv))
    assert exit_.value.code == 2
    return capsys.readouterr().err


def test_defaults_are_llama_cpp_alone_one_round_and_a_128_token_decode():
    args = prefill.parse_args([])
    assert args.peers == ["llama.cpp"] and args.lengths == [512, 2048, 8000]
    assert args.rounds == 1 and args.decode_tokens == 128


@pytest.mark.parametrize("argv, message", [
    (["--peers", "llama.cpp,vllm"], "--peers: unknown vllm; choose from llama.cpp, openvino"),
    (["--lengths", "512,2k"], "--lengths '512,2k': give comma-separated token counts"),
    (["--lengths", "0"], "--lengths 0: must be at least 1"),
    (["--rounds", "0"], "--rounds 0: must be at least 1"),
    (["--threads", "0"], "--threads 0: must be at least 1"),
    (["--decode-tokens", "1"], "--decode-tokens 1: a rate needs at least 2 tokens"),
    (["--peers", "openvino"], "--peers openvino needs --openvino-python"),
    (["--peers", "openvino", "--openvino-python", "/nonexistent/python"], "needs --openvino-python"),
])
def test_bad_flags_name_the_flag_and_the_fix(capsys, argv, message):
    assert message in rejected(capsys, *argv)


def test_openvino_needs_an_exported_model_dir(capsys, tmp_path):
    argv = ["--peers", "openvino", "--openvino-python", sys.executable, "--openvino-model", str(tmp_path)]
    assert "a dir with openvino_model.xml from `optimum-cli export openvino`" in rejected(capsys, *argv)
    (tmp_path / "openvino_model.xml").write_text("<net/>")
    args = prefill.parse_args(argv + ["--peers", "llama.cpp,openvino", "--decode-tokens", "0"])
    assert args.peers == ["llama.cpp", "openvino"] and args.openvino_model == str(tmp_path)


def test_ratios_compare_within_a_round_and_a_prompt_length():
    rows = [{"engine": engine, "round": rnd, "prompt_tokens": 512, "prefill_tok_s": rate}
            for rnd, rates in ((1, (600.0, 300.0, 1200.0)), (2, (500.0, 250.0, 1000.0)))
            for engine, rate in zip(("inferplug smollm2-135m", "llama.cpp (x)", "OpenVINO GenAI 1"), rates)]
    rows.append({"engine": "inferplug smollm2-135m", "round": 1, "prompt_tokens": 2048, "prefill_tok_s": 400.0})
    prefill.with_ratios(rows, "prefill_tok_s")
    ours = [(r["round"], r["prompt_tokens"], r["vs_llama_cpp"], r["vs_openvino"]) for r in rows
            if r["engine"].startswith("inferplug")]
    assert ours == [(1, 512, 2.0, 0.5), (2, 512, 2.0, 0.5), (1, 2048, None, None)]
    text = prefill.table(rows, [("engine", "engine", ""), ("round", "round", "d"),
                                ("prefill tok/s", "prefill_tok_s", ".1f")])
    assert text.splitlines()[0] == "| engine | round | prefill tok/s | / llama.cpp | / OpenVINO |"
    assert "| inferplug smollm2-135m | 2 | 500.0 | 2.00x | 0.50x |" in text
    assert "| inferplug smollm2-135m | 1 | 400.0 | n/a | n/a |" in text


def test_openvino_peer_that_cannot_start_says_so(tmp_path):
    with pytest.raises(RuntimeError, match="the OpenVINO peer exited with code 1"):
        prefill.OpenVINOPeer(sys.executable, str(tmp_path / "no-model"), 2)
