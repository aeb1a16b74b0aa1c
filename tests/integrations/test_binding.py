"""LangChain and LlamaIndex front ends bind a profile the same way (no model is loaded here)."""

from __future__ import annotations

import pytest

from inferplug.errors import ModelSourceError, ProfileError
from inferplug.frontend.binding import bind_profile, usage_counts
from inferplug.types import Usage


def test_model_alone_names_the_profile_and_a_model_with_a_profile_renames_it():
    profile, model = bind_profile(None, "smollm2-135m-ct2")
    assert (profile.name, model) == ("smollm2-135m-ct2", "smollm2-135m-ct2")
    profile, model = bind_profile("mistral-7b-gptq", None)
    assert (profile.name, model) == ("mistral-7b-gptq", "mistral-7b-instruct")  # [model] served_name
    assert bind_profile("mistral-7b-gptq", "my-alias")[1] == "my-alias"
    with pytest.raises(ProfileError):
        bind_profile(None, "no-such-profile")


@pytest.mark.parametrize("front_end", ["langchain_chat", "langchain_llm", "llama_index"])
def test_every_front_end_reports_the_served_name(front_end):
    cls, ours = _front_end(front_end)
    bound = cls(profile="mistral-7b-gptq")
    assert (ours(bound).name, bound.model) == ("mistral-7b-gptq", "mistral-7b-instruct")
    assert ours(cls(model="smollm2-135m-ct2")).name == "smollm2-135m-ct2"


@pytest.mark.parametrize("front_end", ["langchain_chat", "langchain_llm", "llama_index"])
def test_every_front_end_takes_a_model_with_no_toml_and_the_context_asked(front_end, tiny_llama_dir, tmp_path,
                                                                          monkeypatch):
    from tests.test_sources import fake_hf_cache

    cls, ours = _front_end(front_end)
    bound = cls(profile=str(tiny_llama_dir), context_length=256)
    assert (ours(bound).name, bound.model) == (tiny_llama_dir.name, tiny_llama_dir.name)
    assert (ours(bound).model.path, ours(bound).limits.max_model_len) == (tiny_llama_dir, 256)
    if front_end == "langchain_chat":  # LangChain's ModelProfile comes from the plan: the context asked
        assert bound.profile["max_input_tokens"] == 256
    monkeypatch.setenv("INFERPLUG_HOME", str(tmp_path))
    fake_hf_cache(tmp_path, "org/tiny", {"config.json": (tiny_llama_dir / "config.json").read_bytes()})
    assert ours(cls(profile="hf:org/tiny")).model.hf_repo == "org/tiny"
    with pytest.raises(ModelSourceError, match="no such file or directory. Fix:"):
        cls(profile=str(tmp_path / "absent.gguf"))


@pytest.mark.parametrize("front_end", ["langchain_chat", "langchain_llm"])
def test_langchain_traces_name_inferplug_and_the_served_model(front_end):
    """LangChain's own _get_ls_params names the provider from the class and the model from `model` (no override)."""
    cls, _ = _front_end(front_end)
    bound = cls(profile="mistral-7b-gptq", temperature=0.5, max_tokens=7)
    params = bound._get_ls_params(stop=["x"])
    assert (params["ls_provider"], params["ls_model_name"]) == ("inferplug", "mistral-7b-instruct")
    assert (params["ls_temperature"], params["ls_max_tokens"], params["ls_stop"]) == (0.5, 7, ["x"])
    assert bound._get_ls_params(model="other")["ls_model_name"] == "other"  # a call's model= wins


def _front_end(name: str):
    """(the class, how to reach our Profile on an instance: LangChain's chat models keep `.profile` for theirs)."""
    if name == "llama_index":
        from llama_index.llms.inferplug import InferPlug

        return InferPlug, lambda m: m.profile
    from langchain_inferplug import ChatInferPlug, InferPlugLLM

    return (ChatInferPlug if name == "langchain_chat" else InferPlugLLM), lambda m: m.inferplug_profile


def test_usage_counts():
    assert usage_counts(Usage(7, 3, 4)) == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10,
                                            "cached_tokens": 4}
