"""inferplug: fast local LLM inference as a one-line choice in LangChain and LlamaIndex apps.

`from inferplug import LLM, SamplingParams` works without importing torch until an LLM is built.
"""

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "LLM": "inferplug.llm",
    "RequestOutput": "inferplug.llm",
    "CompletionOutput": "inferplug.llm",
    "SamplingParams": "inferplug.types",
    "Request": "inferplug.types",
    "Event": "inferplug.types",
}

__all__ = ["__version__", *_LAZY]

if TYPE_CHECKING:
    from inferplug.llm import LLM, CompletionOutput, RequestOutput
    from inferplug.types import Event, Request, SamplingParams


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'inferplug' has no attribute {name!r}")
