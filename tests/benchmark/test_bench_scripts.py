"""Every bench/*.py imports (so a renamed function one of them imports fails here, not on the day a figure is
taken), none imports another (their shared code is inferplug/benchmark/'s), and each script whose main() reads its
own flags calls it when run and answers --help. Imported as `python bench/NAME.py` runs them: with bench/ first on
sys.path."""

from __future__ import annotations

import ast
import inspect
import sys

import pytest

from tests.benchmark.bench_helpers import BENCH, load_bench

SCRIPTS = sorted(path.stem for path in BENCH.glob("*.py"))


@pytest.fixture
def as_a_script():
    """bench/ first on sys.path, as `python bench/NAME.py` has it; sys.path and the modules the script brought
    from bench/ are put back after, so the rest of the run never sees them."""
    saved_path, saved_modules = sys.path[:], set(sys.modules)
    sys.path.insert(0, str(BENCH))
    yield
    sys.path[:] = saved_path
    for name in set(sys.modules) - saved_modules:
        if str(getattr(sys.modules[name], "__file__", None) or "").startswith(str(BENCH)):
            del sys.modules[name]


def test_the_scripts_are_found():
    assert {"rag_cache", "rag_paper_7b", "engine_throughput", "peers"} <= set(SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_no_bench_script_imports_another(name):
    tree = ast.parse((BENCH / f"{name}.py").read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module and not node.level}
    assert not imported & {*SCRIPTS, "bench"}, f"bench/{name}.py imports {sorted(imported & {*SCRIPTS, 'bench'})}"
    assert not any(isinstance(node, ast.ImportFrom) and node.level for node in ast.walk(tree))


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_bench_script_imports_and_answers_help(name, as_a_script, monkeypatch, capsys):
    module = load_bench(name)
    main = getattr(module, "main", None)
    if main is None or any(p.default is p.empty for p in inspect.signature(main).parameters.values()):
        return  # a library of the others (or a worker another starts), or a main() given its paths by its caller
    tree = ast.parse((BENCH / f"{name}.py").read_text())  # run as a script, it calls main() (a lost guard ran nothing)
    assert any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) and "main()" in ast.unparse(node)
               for node in tree.body), f"`python bench/{name}.py` never calls main()"
    monkeypatch.setattr(sys, "argv", [f"bench/{name}.py", "--help"])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith("usage:")
