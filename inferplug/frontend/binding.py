"""What every front end does with the profile it is given: load it, name the model, report usage."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inferplug.profile import Profile
    from inferplug.types import Usage


def bind_profile(profile: Any, model: str | None, context_length: int | None = None) -> tuple[Profile, str]:
    """(the loaded profile, the model name to report) for a front end's `profile` and `model` arguments.

    `profile` is a Profile, a name, a TOML path or a model (a GGUF file, an HF dir, hf:..., pypi:...); given alone,
    `model` names the profile (None, None: the default profile). A `model` given with a profile only renames what
    is reported. `context_length`: the context asked (None: the profile's, else the default), as --ctx-size.
    """
    from inferplug.profile import load_profile

    loaded = load_profile(profile if profile is not None else model, context_length=context_length)
    return loaded, model or loaded.served_name


def usage_counts(usage: Usage) -> dict[str, int]:
    """A request's token counts as a plain dict (cached_tokens: prompt tokens whose KV came from a cache)."""
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens, "cached_tokens": usage.cached_tokens}
