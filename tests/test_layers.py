"""The layers of docs/architecture.md, enforced: every module imports only its own layer or the ones below it,
and no two modules import each other, directly or round a circle.

Imports are read with `ast`, so lazy (function-level) imports count as much as top-level ones; imports under
`if TYPE_CHECKING:` do not (they never run). Imports by string (importlib.import_module) are not seen.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {  # import name -> its directory
    "inferplug": ROOT / "inferplug",
    "langchain_inferplug": ROOT / "integrations" / "langchain_inferplug",
    "llama_index.llms.inferplug": ROOT / "integrations" / "llama_index" / "llms" / "inferplug",
}

# Lowest first. A layer's entries are modules or packages (a package stands for every module in it).
# In a layer of peers, an entry may not import another entry of its own layer.
LAYERS: list[tuple[str, bool, list[str]]] = [
    ("core data", False, ["inferplug.errors", "inferplug.types"]),
    ("configuration and facts", False, [
        "inferplug.profile_schema", "inferplug.profile_server", "inferplug.profile_errors", "inferplug.profile",
        "inferplug.profile_toml",
        "inferplug.hardware", "inferplug.sources", "inferplug.source_rules", "inferplug.model_file"]),
    ("kernels, weights, models and the ops they call", False, [
        "inferplug.kernels", "inferplug.quant", "inferplug.ops", "inferplug.models"]),
    ("plans", False, [
        "inferplug.resolver", "inferplug.plan", "inferplug.memory_plan", "inferplug.parallel_plan", "inferplug.replica_plan",
        "inferplug.weight_format_plan", "inferplug.compute_path_plan", "inferplug.rag_cache_plan",
        "inferplug.ct2_compute", "inferplug.host_timings"]),
    ("prompt and output stages", False, ["inferplug.stages", "inferplug.chat_template", "inferplug.rag"]),
    ("engine", False, ["inferplug.engine"]),
    ("backends", False, ["inferplug.backends"]),
    ("front end", False, ["inferplug.frontend", "inferplug.llm"]),
    ("server and integrations", True, ["inferplug.server", "langchain_inferplug", "llama_index.llms.inferplug"]),
    ("commands", False, [
        "inferplug.commands", "inferplug.cli", "inferplug.doctor", "inferplug.selftest", "inferplug.benchmark",
        "inferplug.quality", "inferplug"]),
]


def modules() -> dict[str, Path]:
    found = {}
    for package, directory in PACKAGES.items():
        for path in directory.rglob("*.py"):
            parts = list(path.relative_to(directory).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


MODULES = modules()


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the nodes under `if TYPE_CHECKING:`."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            skipped |= {id(inner) for stmt in node.body for inner in ast.walk(stmt)}
    return skipped


def _owner(name: str) -> str | None:
    """The module of ours that `name` (a module, or an attribute of one) lives in."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name if name in MODULES else None


def imports_of(module: str) -> set[str]:
    """Our modules that `module` imports when it runs."""
    path = MODULES[module]
    return imports_in(path.read_text(), module, is_package=path.name == "__init__.py")


def imports_in(source: str, module: str, *, is_package: bool) -> set[str]:
    tree = ast.parse(source)
    skipped = _type_checking_only(tree)
    names: list[str] = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
            names += [f"{base}.{alias.name}" for alias in node.names]
    return {owner for name in names if (owner := _owner(name)) and owner != module}


def layer_of(module: str) -> tuple[int, str]:
    """(layer index, the entry that holds it): the longest entry that is the module or a package above it."""
    matches = [(len(entry), i, entry) for i, (_, _, entries) in enumerate(LAYERS) for entry in entries
               if module == entry or module.startswith(entry + ".")]
    assert matches, f"{module} is in no layer: add it to LAYERS here and to docs/architecture.md"
    _, index, entry = max(matches)
    return index, entry


GRAPH = {module: imports_of(module) for module in MODULES}


def test_every_module_has_a_layer():
    for module in MODULES:
        layer_of(module)


def test_the_architecture_page_names_every_entry():
    page = (ROOT / "docs" / "architecture.md").read_text()
    for _, _, entries in LAYERS:
        for entry in entries:
            short = entry.removeprefix("inferplug.") if entry != "inferplug" else "inferplug"
            shown = f"`{short}/`" if (PACKAGES["inferplug"] / short.replace(".", "/")).is_dir() else f"`{short}`"
            assert shown in page, f"docs/architecture.md does not name {shown} ({entry})"


def test_imports_only_look_down():
    wrong = []
    for module, targets in sorted(GRAPH.items()):
        (mine, my_entry) = layer_of(module)
        for target in sorted(targets):
            theirs, their_entry = layer_of(target)
            peers = LAYERS[mine][1] and theirs == mine and their_entry != my_entry
            if theirs > mine or peers:
                wrong.append(f"{module} ({LAYERS[mine][0]}) imports {target} ({LAYERS[theirs][0]})")
    assert not wrong, "imports that look up or across:\n" + "\n".join(wrong)


def _circles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(GRAPH):
        if start in index:
            continue
        work = [(start, iter(sorted(GRAPH[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(GRAPH[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circles():
    circles = _circles()
    assert not circles, "modules that import each other:\n" + "\n".join(" <-> ".join(c) for c in circles)


def reachable(start: str) -> set[str]:
    """Every module `start` imports, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for target in GRAPH[todo.pop()] - seen:
            seen.add(target)
            todo.append(target)
    return seen


def test_models_never_reach_the_engine_and_plans_never_reach_a_server_or_an_engine():
    def inside(modules: set[str], package: str) -> list[str]:
        return sorted(m for m in modules if m == package or m.startswith(package + "."))

    for module in MODULES:
        if module.startswith("inferplug.models."):
            assert not inside(reachable(module), "inferplug.engine"), module
    plans = next(entries for name, _, entries in LAYERS if name == "plans")
    for plan in plans:
        for package in ("inferplug.server", "inferplug.engine", "inferplug.backends"):
            assert not inside(reachable(plan), package), (plan, package)


def test_the_walk_sees_lazy_and_relative_imports_and_skips_type_checking_ones():
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from inferplug.engine import llm_engine\n"
              "def f():\n    from inferplug.errors import RequestError\n"
              "from .requests import build_request\nimport inferplug.kernels.cpu\n")
    assert imports_in(source, "inferplug.frontend.calls", is_package=False) == {
        "inferplug.errors", "inferplug.frontend.requests", "inferplug.kernels.cpu"}
