"""Every `inferplug` command run for real on the tiny random Llama or the real SmolLM2, checked on what it prints
(text, exit code, JSON). A subprocess runs the real entry point (`python -m inferplug.cli`); the others call
cli.main in this process, which saves a model load. tests/test_cli.py covers parsing and errors."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys

import pytest

from inferplug.cli import build_parser, main

# Where each command's run is tested; a new command fails test_every_command_runs_in_a_test until it has one.
TESTED = {
    "bench": "test_bench_prints_and_saves_a_complete_run", "chat": "test_chat_answers_each_scripted_line",
    "demo": "test_demo_answers_from_the_corpus_and_reuses_documents", "doctor": "test_doctor_bench_measures_the_engine",
    "generate": "test_generate_streams_the_answer", "profile": "test_cli.py::test_profile_show_gives_each_origin",
    "pull": "test_cli.py::test_pull_default_profile_prints_its_checksum", "resolve": "test_resolve_plans_this_machine",
    "serve": "server/test_serve_command.py::test_serve_binds_loopback_and_answers",
}


def cli(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "inferplug.cli", *argv], input=stdin, capture_output=True,
                          text=True, timeout=300)


def test_every_command_runs_in_a_test():
    assert set(build_parser()._subparsers._group_actions[0].choices) == set(TESTED)


@pytest.mark.smollm2
def test_generate_streams_the_answer(smollm2_gguf):
    result = cli("generate", "smollm2-135m", "What is the capital of France?", "--chat", "--temperature", "0",
                 "--max-tokens", "16", "--stats")
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout
    stats = re.search(r"\[(\d+) prompt \(0 cached\), (\d+) generated, TTFT [\d.]+s, decode [\d.]+ tok/s\]",
                      result.stderr)
    assert stats, result.stderr
    assert int(stats[1]) > 10 and 1 < int(stats[2]) <= 16  # the chat template's tokens; the answer's


@pytest.mark.smollm2
def test_generate_runs_a_gguf_file_with_no_toml_in_the_context_asked(smollm2_gguf):
    answer = cli("generate", str(smollm2_gguf), "What is the capital of France?", "--chat", "--temperature", "0",
                 "--max-tokens", "16", "-c", "512")
    assert answer.returncode == 0, answer.stderr
    assert "Paris" in answer.stdout
    short = cli("generate", str(smollm2_gguf), "What is the capital of France?", "--chat", "--ctx-size", "16")
    assert short.returncode == 2 and short.stderr.count("\n") == 1
    assert re.search(r"the prompt has \d+ tokens but the context holds 16", short.stderr), short.stderr


@pytest.mark.smollm2
def test_chat_answers_each_scripted_line(smollm2_gguf, capsys, monkeypatch):
    """Two turns from stdin, then the empty line that ends the chat; the second turn sees the first. /clear starts
    over: a third turn after it does not see the first two."""
    monkeypatch.setattr(sys, "stdin", io.StringIO(
        "What is the capital of France?\nAnd of Italy?\n/clear\nWhat did I ask first?\n\n"))
    code = main(["chat", "smollm2-135m", "--temperature", "0", "--max-tokens", "24", "--stats"])
    captured = capsys.readouterr()
    out = captured.out
    assert code == 0
    assert out.startswith("chatting with smollm2-135m (native)") and "/clear starts the conversation over" in out
    replies = re.findall(r"assistant> (.*)", out)
    assert len(replies) == 3 and out.count("you> ") == 5 and "(the conversation starts over)" in out, out
    assert "Paris" in replies[0] and "Rome" in replies[1], replies
    prompts = [int(n) for n in re.findall(r"\[(\d+) prompt", captured.err)]
    assert len(prompts) == 3 and prompts[2] < prompts[1], captured.err  # the third turn's prompt left the first two


@pytest.mark.gemma3_270m
def test_chat_with_a_base_model_says_what_to_run_instead_before_the_first_prompt(gemma3_270m_gguf, capsys,
                                                                                 monkeypatch):
    """Gemma 3 270M is a base model: its file has no chat template, so `chat` stops at once and names the ways on."""
    monkeypatch.setattr(sys, "stdin", io.StringIO("What is the capital of France?\n\n"))
    assert main(["chat", str(gemma3_270m_gguf)]) == 2
    out, err = capsys.readouterr()
    assert "you> " not in out and "no chat template" in err
    assert "inferplug generate" in err and "INFERPLUG_MODEL__CHAT_TEMPLATE" in err


@pytest.mark.smollm2
@pytest.mark.slow
def test_demo_answers_from_the_corpus_and_reuses_documents(smollm2_gguf, capsys):
    """The bundled corpus through LlamaIndex and MiniLM embeddings, greedy: each answer holds the fact planted in
    the corpus for it, the questions share documents, and the document cache gives some of them back."""
    from inferplug.commands.demo import QUESTIONS

    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    indexed = re.search(r"(\d+) documents indexed; model smollm2-135m on native", out)
    assert indexed and int(indexed[1]) >= 3, out
    answers = re.findall(r"^A: (.*)$", out, re.M)
    assert len(answers) == len(QUESTIONS), out
    for (question, fact), answer in zip(QUESTIONS, answers):
        assert fact.lower() in answer.lower(), (question, answer)
    rows = re.findall(r"^\d+ +(?:[\d.]+ s|n/a) +(\d+) tok +(\d+) tok \((\d+) docs\) +yes", out, re.M)
    assert len(rows) == len(QUESTIONS), out
    assert rows[0] == ("0", "0", "0")  # a cold cache
    assert sum(int(docs) for *_, docs in rows) > 0, out  # documents seen before, in a new place: the document cache


def test_bench_prints_and_saves_a_complete_run(tiny_profile, tmp_path):
    out = tmp_path / "bench.json"
    result = cli("bench", tiny_profile, "--num-prompts", "3", "--random-input-len", "8", "--random-output-len", "4",
                 "--ignore-eos", "--save-result", str(out), "--no-progress")
    assert result.returncode == 0, result.stderr
    assert f"saved {out}" in result.stdout and "Successful requests" in result.stdout, result.stdout
    data = json.loads(out.read_text())
    assert data["completed"] == 3 and data["failed"] == 0 and data["total_output_tokens"] == 3 * 4


def test_resolve_plans_this_machine(capsys):
    assert main(["resolve", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["profile"] == "smollm2-135m" and plan["backend"] == "native"
    assert plan["num_kv_blocks"] > 0 and plan["reasons"]
    assert main(["resolve"]) == 0
    text = capsys.readouterr().out
    assert "plan for smollm2-135m" in text and "why" in text and plan["reasons"][0][:40] in " ".join(text.split())


@pytest.mark.smollm2
def test_doctor_bench_measures_the_engine(smollm2_gguf, capsys):
    """A 1-second budget: every figure is measured and positive, and the default profile's engine ran."""
    code = main(["doctor", "--json", "--bench", "--bench-seconds", "1"])
    report = json.loads(capsys.readouterr().out)
    assert code == (0 if report["ok"] else 1)
    bench = report["bench"]
    assert "engine_error" not in bench, bench.get("engine_error")
    assert bench["profile"] == "smollm2-135m" and bench["backend"] == "native"
    assert min(bench["matmul_flops"].values()) > 0 and bench["memory_bandwidth_bytes_per_s"] > 0
    assert bench["prefill_tokens_per_s"] > 0 and bench["decode_tokens_per_s"] > 0
