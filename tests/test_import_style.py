"""One import style in tests/: a helper module is imported as `tests.<dir>.<module>` (pyproject's pythonpath puts the
repo root on sys.path), never by its bare name, which works only while pytest happens to have put the helper's own
directory on sys.path, and which makes a second copy of the module (and of its state) beside the dotted one.

Imports are read with `ast`, so lazy (function-level) imports count. tests/fakes/ is left out: its packages stand in
for third-party ones (exllamav2) and are imported by those packages' names on purpose.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
FAKES = TESTS / "fakes"


def _ours(path: Path) -> bool:
    return FAKES not in path.parents


HELPERS = {path.stem for path in TESTS.rglob("*.py") if _ours(path) and path.stem not in ("conftest", "__init__")}


def bare_imports(source: str) -> list[tuple[int, str]]:
    """(line, module) of each import of a tests module by its bare name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [(node.lineno, name) for name in names if name.split(".")[0] in HELPERS]
    return found


def test_tests_import_their_helpers_as_tests_dot_dir_dot_module():
    wrong = [f"{path.relative_to(TESTS.parent)}:{line}: import of {name}"
             for path in sorted(TESTS.rglob("*.py")) if _ours(path)
             for line, name in bare_imports(path.read_text())]
    assert not wrong, "bare imports of tests helpers (write `from tests.<dir>.<module> import ...`):\n" + "\n".join(wrong)


def test_the_walk_sees_lazy_bare_imports_and_passes_dotted_ones():
    source = ("import torch\nfrom tests.engine.engine_helpers import make_engine\n"
              "def f():\n    from quant_fixtures import NAMES\n    import engine_helpers\n")
    assert bare_imports(source) == [(4, "quant_fixtures"), (5, "engine_helpers")]
