"""Property-based fuzzing of the GGUF and safetensors header readers (issue 29): mutations of a valid small file
(truncations, byte flips, length fields set huge, arrays and JSON nested deep) are read by the low-level reader and by
the facts `inferplug resolve` reads (memory_plan.facts_from_file). Every outcome is a parse or a ModelSourceError,
never another exception, and within hypothesis' deadline per file (a hang bound: the readers take milliseconds).

Run time: the example counts below keep the module under ~30 s on the shared 2-core host. HYPOTHESIS_PROFILE=long
runs 50x more of each (a manual soak, not CI)."""

from __future__ import annotations

import itertools
import json
import os
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from inferplug.errors import ModelSourceError
from inferplug.models.gguf import clear_header_cache, read_gguf
from inferplug.models.safetensors_reader import read_header
from tests.models.header_bytes import (
    ARRAY, LLAMA_KVS, U8, gguf_file, gguf_string, gguf_tensor_info, safetensors_file, small_gguf, small_safetensors,
)

SCALE = 50 if os.environ.get("HYPOTHESIS_PROFILE") == "long" else 1
FUZZ = settings(max_examples=300 * SCALE, deadline=2000, derandomize=SCALE == 1, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
HUGE = st.sampled_from([0, 1, 2**31, 2**32 - 1, 2**40, 2**62, 2**63 - 1, 2**64 - 1]) | st.integers(0, 2**64 - 1)
_names = itertools.count()


def mutated(valid: bytes) -> st.SearchStrategy[bytes]:
    """`valid` truncated, with bytes flipped, or with a u64 (a length or count field, or any 8 bytes) set huge."""
    size = len(valid)
    truncated = st.integers(0, size - 1).map(lambda n: valid[:n])
    flips = st.lists(st.tuples(st.integers(0, size - 1), st.integers(0, 255)), min_size=1, max_size=8)
    flipped = flips.map(lambda changes: _patched(valid, [(at, bytes([b])) for at, b in changes]))
    huge = st.tuples(st.integers(0, size - 8), HUGE).map(lambda f: _patched(valid, [(f[0], struct.pack("<Q", f[1]))]))
    return st.one_of(truncated, flipped, huge)


def _patched(raw: bytes, changes: list[tuple[int, bytes]]) -> bytes:
    out = bytearray(raw)
    for at, new in changes:
        out[at : at + len(new)] = new
    return bytes(out)


@st.composite
def nested_gguf(draw) -> bytes:
    """A metadata array nested `depth` deep (a declared count of items that may be a lie), then maybe a tensor."""
    depth, count = draw(st.integers(1, 3000)), draw(st.integers(0, 3) | HUGE)
    nest = gguf_string("deep") + struct.pack("<I", ARRAY) + struct.pack("<IQ", ARRAY, count) * depth
    tensors = [gguf_tensor_info("t", [4], 0, 0)] if draw(st.booleans()) else []
    return gguf_file([*LLAMA_KVS, nest + struct.pack("<IQ", U8, 0)], tensors, bytes(32))


JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=20)


@st.composite
def hostile_safetensors_header(draw) -> bytes:
    """The valid header with one tensor field (or a whole entry) replaced by arbitrary JSON, or nested deep."""
    header = json.loads(small_safetensors()[8:][: struct.unpack("<Q", small_safetensors()[:8])[0]])
    if draw(st.booleans()):
        name = draw(st.sampled_from(["a.weight", "b.bias"]))
        field = draw(st.sampled_from(["dtype", "shape", "data_offsets", None]))
        if field is None:
            header[name] = draw(JSON)
        else:
            header[name][field] = draw(JSON)
        return safetensors_file(header, bytes(32))
    depth = draw(st.integers(1, 200_000))
    return safetensors_file(b"[" * depth + b"]" * depth)


def outcome(read, path: Path) -> str:
    """"parsed" or "refused"; any other exception fails the property."""
    try:
        read(path)
    except ModelSourceError:
        return "refused"
    return "parsed"


def write(folder: Path, raw: bytes, suffix: str) -> Path:
    path = folder / f"f{next(_names)}{suffix}"  # a fresh name: neither the header cache nor the facts memo can hit
    path.write_bytes(raw)
    return path


def read_gguf_cold(path: Path):
    clear_header_cache()
    return read_gguf(path)


@pytest.fixture
def folder(tmp_path_factory, monkeypatch) -> Path:
    monkeypatch.setenv("INFERPLUG_HOME", str(tmp_path_factory.mktemp("fuzz-home")))
    return tmp_path_factory.mktemp("fuzz")


@FUZZ
@given(raw=mutated(small_gguf()) | nested_gguf())
def test_a_mutated_gguf_is_read_or_refused_by_the_reader_and_the_facts_resolve_reads(folder, raw):
    from inferplug.memory_plan import facts_from_file

    path = write(folder, raw, ".gguf")
    outcome(read_gguf_cold, path)
    clear_header_cache()
    outcome(facts_from_file, path)


@FUZZ
@given(raw=mutated(small_safetensors()) | hostile_safetensors_header())
def test_a_mutated_safetensors_file_is_read_or_refused(folder, raw):
    outcome(read_header, write(folder, raw, ".safetensors"))
