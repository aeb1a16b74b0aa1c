"""One shared backend per profile per process: the documented registry of loaded models.

LangChain, LlamaIndex, the server and the CLI all call `get_backend(profile)`; two chat models
built from the same profile share one engine (and its KV cache) instead of loading it twice.
"""

from __future__ import annotations

import atexit
import threading
from pathlib import Path

from inferplug.backends.base import Backend, backend_class
from inferplug.hardware import Hardware, probe
from inferplug.profile import Profile, load_profile
from inferplug.resolver import resolve

_backends: dict[str, Backend] = {}
_lock = threading.Lock()


def get_backend(profile: str | Path | Profile | None = None, hardware: Hardware | None = None) -> Backend:
    """The loaded backend for `profile` (name, path or Profile; None: the default), built on first use."""
    loaded = load_profile(profile)
    key = loaded.identity
    with _lock:  # held while loading, so two threads never load the same model twice
        backend = _backends.get(key)
        if backend is None:
            plan = resolve(loaded, hardware or probe())
            backend = backend_class(plan.backend)(loaded, plan)
            _backends[key] = backend
        return backend


def close_backend(profile: str | Path | Profile | None = None) -> None:
    """Close and forget the backend of `profile`, if one is loaded."""
    key = load_profile(profile).identity
    with _lock:
        backend = _backends.pop(key, None)
    if backend is not None:
        backend.close()


def close_all() -> None:
    with _lock:
        backends = list(_backends.values())
        _backends.clear()
    for backend in backends:
        backend.close()


# Backends still open at exit close while the interpreter is whole: an engine's step thread and its grammar
# compilers' thread pools, left to the interpreter's teardown, could abort the process ("terminate called without
# an active exception", SIGABRT, 3 runs in 5 of a LangChain script with a named tool_choice)
atexit.register(close_all)


def loaded_backends() -> list[Backend]:
    with _lock:
        return list(_backends.values())
