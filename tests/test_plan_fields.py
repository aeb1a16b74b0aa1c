"""Every field of the resolver's Plan is read by something that acts on it: a backend (the native engine's
config is checked by changing the field), or the reports that explain a plan; every field of a backend's
Capabilities by a front end. A field nothing reads is a promise nobody keeps."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from inferplug.backends.native import engine_config
from inferplug.plan import Plan
from inferplug.types import Capabilities

ROOT = Path(__file__).resolve().parent.parent
EXPLANATIONS = {"memory", "reasons", "rejected"}  # why the plan is what it is: `inferplug resolve` and doctor print them
REPORTS = {"inferplug/commands/resolve.py", "inferplug/doctor.py"}
# The native engine's config, from each field it runs by: another value of the field must change it.
NATIVE_CHANGES = {"device": "cuda:0", "dtype": "bfloat16", "attention": "triton", "block_size": 32, "num_kv_blocks": 7,
                  "max_model_len": 99, "max_num_seqs": 3, "max_num_batched_tokens": 77,
                  "max_prefill_tokens_while_decoding": 5, "kv_dtype": "float16", "prefix_caching": False,
                  "rag_document_cache": True, "tensor_parallel_size": 3, "threads_per_rank": 2,
                  "weight_format": "int4", "prefill_gemm": "int8"}


def _readers(field: str, owner: str = "plan") -> set[str]:
    """Files that read `<owner>.<field>` (resolver.py writes the plan, so it does not count)."""
    pattern = re.compile(rf"\b{owner}\.{field}\b")
    files = [*(ROOT / "inferplug").rglob("*.py"), *(ROOT / "integrations").rglob("*.py")]
    return {str(f.relative_to(ROOT)) for f in files if f.name != "resolver.py" and pattern.search(f.read_text())}


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(Plan)])
def test_every_plan_field_has_a_reader(field):
    readers = _readers(field)
    if field in EXPLANATIONS:
        assert readers & REPORTS, f"Plan.{field} explains the plan, but no report prints it"
    else:
        assert any(r.startswith("inferplug/backends/") or r == "inferplug/llm.py" for r in readers), \
            f"no backend reads Plan.{field} (read only in {sorted(readers) or 'nothing'})"


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(Capabilities)])
def test_every_capability_has_a_front_end_reader(field):
    readers = _readers(field, "capabilities") | _readers(field, "caps")
    assert any(r.startswith(("inferplug/frontend/", "inferplug/server/", "integrations/")) for r in readers), \
        f"no front end reads Capabilities.{field}: drop it, or make the front ends act on it"


def _cpu_plan() -> Plan:
    return Plan(backend="native", device="cpu", dtype="float32", attention="torch", num_kv_blocks=64,
                max_model_len=512, max_num_seqs=4, max_num_batched_tokens=256)


@pytest.mark.parametrize("field", NATIVE_CHANGES)
def test_the_native_engine_config_follows_the_field(field):
    base = _cpu_plan()
    assert engine_config(dataclasses.replace(base, **{field: NATIVE_CHANGES[field]})) != engine_config(base)

