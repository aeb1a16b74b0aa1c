"""Counts the calls one request makes through our code, on every thread it crosses, with sys.setprofile.

Only functions defined in inferplug/ and integrations/ count (LangChain's, pydantic's and torch's frames do not).
The engine's own work (`LLMEngine.step`, `LLMEngine.add_request`) counts as one call each, their insides not:
what is counted is the path around the engine, from the front end to the engine step and back.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OURS = (str(ROOT / "inferplug") + "/", str(ROOT / "integrations") + "/")


_EXPRESSIONS = {"<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>"}  # frames of expressions, not calls


class CallCounter:
    def __init__(self, opaque: set[tuple[str, str]]):
        """opaque: (file name, qualified name) of the functions whose insides are not counted."""
        self.opaque = opaque
        self.counting = False
        self.calls: Counter[tuple[str, str]] = Counter()  # in the order of each one's first call
        self.threads: dict[tuple[str, str], str] = {}  # the thread of each one's first call
        self._lock = threading.Lock()
        self._local = threading.local()

    def hook(self, frame, event, arg) -> None:
        local = self._local
        inside = getattr(local, "inside", None)
        if event == "return":
            if inside is frame:
                local.inside = None
            return
        if event != "call" or inside is not None:
            return
        code = frame.f_code
        if not code.co_filename.startswith(OURS) or code.co_name in _EXPRESSIONS:
            return
        key = (str(Path(code.co_filename).relative_to(ROOT)), code.co_qualname)
        if key in self.opaque:
            local.inside = frame
        if self.counting:
            with self._lock:
                self.calls[key] += 1
                self.threads.setdefault(key, threading.current_thread().name)

    def __enter__(self) -> CallCounter:
        threading.setprofile(self.hook)  # threads started from now on (the engine's) report too
        sys.setprofile(self.hook)
        return self

    def __exit__(self, *exc) -> None:
        sys.setprofile(None)
        threading.setprofile(None)

    @property
    def files(self) -> set[str]:
        return {path for path, _ in self.calls}

    def report(self) -> str:
        """The path in the order it runs (each call at its first), with the thread it runs on."""
        return "\n".join(f"{n:4d}  {self.threads[key]:<18} {key[0]}:{key[1]}" for key, n in self.calls.items())
