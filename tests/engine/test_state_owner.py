"""One writer per field: a sequence's token counts, tokens and blocks change only in the scheduler (and the
BlockManager it owns), never in the engine, the runner, the sampler or the RAG document cache."""

from __future__ import annotations

import ast
from pathlib import Path

import inferplug

OWNED = {"num_computed_tokens", "num_cached_tokens", "token_ids", "block_table", "block_hashes",
         "num_committed_blocks", "siblings_waiting"}
# engine/draft.py writes only its own shadow sequences (the draft model's view, in the draft's own pool)
OWNERS = {"engine/scheduler.py", "engine/block_manager.py", "engine/sequence.py", "engine/draft.py"}
MUTATORS = {"append", "extend", "clear", "pop", "insert", "remove"}


def _writes(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            targets = [node.func.value]
        for target in targets:
            while isinstance(target, ast.Subscript):  # seq.block_hashes[:] = ...
                target = target.value
            if isinstance(target, ast.Attribute) and target.attr in OWNED:
                found.append((node.lineno, target.attr))
    return found


def test_only_the_scheduler_writes_sequence_state():
    root = Path(inferplug.__file__).parent
    strays = []
    for path in sorted((root / "engine").rglob("*.py")):  # where Sequences live
        rel = path.relative_to(root).as_posix()
        if rel in OWNERS:
            continue
        strays += [f"{rel}:{line} writes .{attr}" for line, attr in _writes(ast.parse(path.read_text()))]
    assert strays == [], "sequence state written outside the scheduler:\n" + "\n".join(strays)
