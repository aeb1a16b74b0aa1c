"""What every front end does with the profile it is given: load it, name the model, report usage."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inferplug.profile import Profile
    from inferplug.types import Usage


def bind_profile(profile: Any, model: str | None, context_length: int | None = None, *, api_key: Any = None,
                 base_url: str | None = None) -> tuple[Profile, str]:
    """(the loaded profile, the model name to report) for a front end's `profile` and `model` arguments.

    `profile` is a Profile, a name, a TOML path or a model (a GGUF file, an HF dir, hf:..., pypi:...); given alone,
    `model` names the profile (None, None: the default profile). A `model` given with a profile only renames what
    is reported. `context_length`: the context asked (None: the profile's, else the default), as --ctx-size.
    `api_key` (a SecretStr or str) and `base_url`, as ChatOpenAI takes them, set a remote (backend = "openai")
    profile's [openai] api_key and base_url; a local profile needs neither and is left as it is.
    """
    from inferplug.profile import load_profile

    loaded = load_profile(profile if profile is not None else model, context_length=context_length)
    if loaded.backend == "openai" and (api_key is not None or base_url is not None):
        loaded = loaded.model_copy(deep=True)
        if api_key is not None:
            loaded.openai.api_key = api_key
        if base_url is not None:
            loaded.openai.base_url = base_url
    return loaded, model or loaded.served_name


def usage_counts(usage: Usage) -> dict[str, int]:
    """A request's token counts as a plain dict (cached_tokens: prompt tokens whose KV came from a cache)."""
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens, "cached_tokens": usage.cached_tokens}
