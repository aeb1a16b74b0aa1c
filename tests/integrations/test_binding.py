"""LangChain and LlamaIndex front ends bind a profile the same way (no model is loaded here)."""

from __future__ import annotations

import pytest

from inferplug.errors import ProfileError
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
    if front_end == "llama_index":
        from llama_index.llms.inferplug import InferPlug as cls
    elif front_end == "langchain_llm":
        from langchain_inferplug import InferPlugLLM as cls
    else:
        from langchain_inferplug import ChatInferPlug as cls
    def ours(m):  # LangChain's chat models keep `.profile` for its ModelProfile
        return m.inferplug_profile if front_end.startswith("langchain") else m.profile

    bound = cls(profile="mistral-7b-gptq")
    assert (ours(bound).name, bound.model) == ("mistral-7b-gptq", "mistral-7b-instruct")
    assert ours(cls(model="smollm2-135m-ct2")).name == "smollm2-135m-ct2"


def test_usage_counts():
    assert usage_counts(Usage(7, 3, 4)) == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10,
                                            "cached_tokens": 4}
