"""Every profile key and command-line flag that docs/*.md and the README name exists: the keys in the pydantic
schema (inferplug.profile_schema.Profile), the flags in the argparse parsers of `inferplug` and of bench/*.py.

A key is named as `[table] key`, `[table]` `key`, `table.key`, `key = value`, INFERPLUG_TABLE__KEY (or `TABLE__KEY=`), a line of a
```toml block, or a row of the README's reference table. A flag belongs to the command before it in its code line
or backtick span (`inferplug serve ... --port`, `bench/prefill.py --lengths`); a flag alone in prose (`--url`) to
any parser of ours. Flags of other programs (ray, pip, llama.cpp) are not ours to check.
"""

from __future__ import annotations

import argparse
import ast
import re
import typing
from pathlib import Path

from pydantic import BaseModel

from inferplug.cli import build_parser
from inferplug.profile_schema import Profile

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
OTHER_PROGRAMS = {"ray", "pip", "perplexity", "llama-server", "llama-bench", "cmake", "vllm", "git", "make", "curl"}


# --- what exists -------------------------------------------------------------------------------
def _tables(model: type[BaseModel], prefix: str = "") -> dict[str, set[str]]:
    """{table path ("" for the top level): its keys}, nested tables included."""
    found = {prefix: set(model.model_fields)}
    for name, field in model.model_fields.items():
        for inner in (field.annotation, *typing.get_args(field.annotation)):
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                found.update(_tables(inner, f"{prefix}.{name}".lstrip(".")))
    return found


TABLES = _tables(Profile)
ALL_KEYS = set().union(*TABLES.values())


def _option_strings(parser) -> set[str]:
    flags = set()
    for action in parser._actions:
        flags.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):  # `inferplug profile show`: its own flags count too
            for sub in action.choices.values():
                flags |= _option_strings(sub)
    return flags


def _cli_flags() -> dict[str, set[str]]:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    return {name: _option_strings(sub) for name, sub in commands.items()}


def _script_flags(path: Path) -> set[str]:
    """The flags a bench script's add_argument calls declare (read with ast: the scripts import heavy peers)."""
    return {arg.value for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument"
            for arg in node.args if isinstance(arg, ast.Constant) and str(arg.value).startswith("-")}


FLAGS = {f"inferplug {name}": flags for name, flags in _cli_flags().items()}
FLAGS |= {f"bench/{path.name}": _script_flags(path) for path in (ROOT / "bench").glob("*.py")}
COMMAND = re.compile("|".join(re.escape(name) for name in sorted(FLAGS, key=len, reverse=True))
                     + r"|(?:^|\s)(" + "|".join(map(re.escape, OTHER_PROGRAMS)) + r")\s")
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


# --- what the pages name -----------------------------------------------------------------------
def _lines(page: Path):
    """(line number, text, the language of the code block it is in or None) with backslash continuations joined."""
    fence, pending = None, ""
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.startswith("```"):
            fence = None if fence is not None else line[3:].strip()
            continue
        if line.endswith("\\"):
            pending += line[:-1]
            continue
        yield number, pending + line, fence
        pending = ""


def _key_mentions(text: str, toml_table: str | None):
    """(table or None for any, key) pairs that a line names."""
    if toml_table is not None:
        if (header := re.match(r"\s*\[([a-z_.]+)\]", text)):
            yield header.group(1), None
        elif (key := re.match(r"\s*([a-z_]+)\s*=", text)):
            yield toml_table, key.group(1)
        return
    for table, inline, next_span in re.findall(r"`\[([a-z_.]+)\](?: ([a-z_]+)|` `([a-z_]+))?", text):
        yield table, inline or next_span or None
    for table, key in re.findall(r"`([a-z_]+)\.([a-z_]+)`", text):
        if table in TABLES:
            yield table, key
    for key in re.findall(r"`([a-z_]+) = ", text):
        yield None, key
    for table, key in re.findall(r"(?:\bINFERPLUG_|`)([A-Z0-9]+)__([A-Z0-9_]+)", text):  # `CACHE__KV_DTYPE=float16` too
        yield table.lower(), key.lower()
    yield from _reference_row(text)


def _reference_row(text: str):
    """A row of the README's key table: `[table]` then its keys, or keys of the top level."""
    cells = [c.strip() for c in text.strip().strip("|").split("|")]
    if not text.startswith("| `") or len(cells) < 3:
        return
    head = re.match(r"`\[([a-z_.]+)\]`(.*)", cells[0])
    if head is None:
        for key in re.findall(r"`([a-z_]+)`", cells[0]):
            yield "", key
        return
    table, keys = head.group(1), re.findall(r"`([a-z_]+)`", head.group(2))
    if not keys:  # the keys are the second cell's names, outside the parentheses that hold their values
        keys = re.findall(r"`([a-z_]+)`", _outside_parentheses(cells[1]))
    for key in keys:
        yield table, key


def _outside_parentheses(text: str) -> str:
    depth, kept = 0, []
    for ch in text:
        depth += ch == "("
        kept.append(ch if depth == 0 else " ")
        depth -= ch == ")" and depth > 0
    return "".join(kept)


def _in_key_table(page: Path, number: int) -> bool:
    lines = page.read_text().splitlines()
    start = number - 1
    while start > 0 and lines[start - 1].startswith("|"):
        start -= 1
    return lines[start].startswith("| key |")


def _unknown_keys(page: Path) -> list[str]:
    wrong, toml_table = [], ""
    for number, text, fence in _lines(page):
        in_toml = fence == "toml"
        if in_toml and (header := re.match(r"\s*\[([a-z_.]+)\]", text)):
            toml_table = header.group(1)
        if text.startswith("| `") and not _in_key_table(page, number):
            text = text.split("|", 2)[1]  # another table's first cell is not a key list: keep only inline mentions
        for table, key in _key_mentions(text, toml_table if in_toml else None):
            where = f"{page.name}:{number}"
            if table is not None and table not in TABLES:
                wrong.append(f"{where}: no [{table}] table in the profile")
            elif key is not None and key not in (ALL_KEYS if table is None else TABLES[table]):
                wrong.append(f"{where}: no key {key!r} in {f'[{table}]' if table else 'the profile'}")
        if not in_toml:
            toml_table = ""
    return wrong


def _unknown_flags(page: Path) -> list[str]:
    """A flag is checked against the command before it in its code line or backtick span, else against every
    parser of ours (prose such as "`--url` sends ...")."""
    wrong, anyone = [], set().union(*FLAGS.values())
    for number, text, in_code in _lines(page):
        for span in [text] if in_code is not None else re.findall(r"`([^`]*)`", text):
            commands = [(m.start(), m.group(0).strip()) for m in COMMAND.finditer(span)]
            for flag in FLAG.finditer(span):
                before = [c for at, c in commands if at < flag.start()]
                command = before[-1] if before else None
                if command in OTHER_PROGRAMS:
                    continue
                if flag.group(1) not in (FLAGS[command] if command else anyone):
                    wrong.append(f"{page.name}:{number}: {command or 'no command of ours'} has no {flag.group(1)}")
    return wrong


def test_every_profile_key_the_docs_name_exists():
    wrong = [w for page in PAGES for w in _unknown_keys(page)]
    assert not wrong, "docs name profile keys the schema does not have:\n" + "\n".join(wrong)


def test_every_flag_the_docs_name_exists():
    wrong = [w for page in PAGES for w in _unknown_flags(page)]
    assert not wrong, "docs name flags no parser has:\n" + "\n".join(wrong)


def test_the_checks_catch_a_wrong_name(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Set `[cache] kv_dtpye`, `limits.max_seqs`, `INFERPLUG_NATIVE__THREADS` or `CACHE__SIZE=1`.\n"
                    "```toml\n[cache]\nblock = 16\n```\n`inferplug serve x --portt 1` and `--ctx-size`\n")
    assert _unknown_keys(page) == [
        "page.md:1: no key 'kv_dtpye' in [cache]", "page.md:1: no key 'max_seqs' in [limits]",
        "page.md:1: no key 'threads' in [native]", "page.md:1: no key 'size' in [cache]",
        "page.md:4: no key 'block' in [cache]"]
    assert _unknown_flags(page) == ["page.md:6: inferplug serve has no --portt"]
