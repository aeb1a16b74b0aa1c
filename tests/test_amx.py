"""AMX where it is advertised but unusable: the tile permission is asked for and its answer checked
(hardware.amx_tiles), torch's oneDNN is held below AMX where it is refused, and resolve and doctor say so.
inferplug's own kernels issue no tile instruction."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

from inferplug import doctor
from inferplug.compute_path_plan import BELOW_AMX, ONEDNN_ISA_ENV, onednn_max_isa
from inferplug.hardware import AMX_OFF_ENV, Hardware, amx_tiles, probe
from inferplug.profile import load_profile
from inferplug.resolver import resolve

AMX_CPU = frozenset({"avx2", "fma", "f16c", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"})
HW = Hardware(cpu_model="test cpu", cpu_flags=AMX_CPU, cpu_count=2, ram_total=8 << 30, ram_available=6 << 30,
              packages=frozenset({"torch", "transformers"}))


def test_a_cpu_without_amx_has_no_answer_and_no_hold():
    assert amx_tiles(frozenset({"avx2", "avx512f"})) is None
    assert onednn_max_isa(dataclasses.replace(HW, cpu_flags=frozenset({"avx2"}))) == (None, "")


def test_this_hosts_answer_is_the_kernels(monkeypatch):
    monkeypatch.delenv(AMX_OFF_ENV, raising=False)
    answer = probe().amx_tiles
    if "amx_tile" in probe().cpu_flags:  # asked for real: arch_prctl grants the tiles or says why not
        assert answer == "granted" or answer.startswith("refused by the kernel (arch_prctl")
    else:
        assert answer is None


def test_the_off_switch_answers_as_a_refusing_kernel(monkeypatch):
    monkeypatch.setenv(AMX_OFF_ENV, "1")
    assert amx_tiles(AMX_CPU) == f"refused: {AMX_OFF_ENV}=1"


def test_refused_tiles_hold_onednn_below_amx_in_the_plan_and_in_doctor(tiny_llama_dir, tmp_path):
    toml = tmp_path / "amx.toml"
    toml.write_text(f'backend = "native"\ndtype = "float32"\n[model]\npath = "{tiny_llama_dir}"\n')
    refused = dataclasses.replace(HW, amx_tiles=f"refused: {AMX_OFF_ENV}=1")
    plan = resolve(load_profile(str(toml)), refused)
    assert plan.onednn_max_isa == BELOW_AMX
    assert any(r.startswith("AMX advertised but unusable") and ONEDNN_ISA_ENV in r for r in plan.reasons)
    granted = resolve(load_profile(str(toml)), dataclasses.replace(HW, amx_tiles="granted"))
    assert granted.onednn_max_isa is None and any("tile data granted" in r for r in granted.reasons)
    assert BELOW_AMX in doctor.collect(refused)["amx"]
    assert doctor.collect(dataclasses.replace(HW, cpu_flags=frozenset({"avx2"})))["amx"] is None


FORCED = """
import dataclasses, json, os, sys
import torch
from inferplug.backends.native import build_engine
from inferplug.hardware import probe
from inferplug.profile import load_profile
from inferplug.resolver import resolve
from inferplug.types import Request, SamplingParams
profile = load_profile(sys.argv[1])
host = probe()
hw = dataclasses.replace(host, cpu_flags=host.cpu_flags | {"amx_tile"}, amx_tiles="refused: INFERPLUG_NO_AMX=1")
engine = build_engine(profile, resolve(profile, hw))
engine.add_request(Request(prompt=[5, 6, 7], request_id="r", params=SamplingParams(temperature=0.0, max_tokens=4,
                                                                                 ignore_eos=True)))
tokens = []
while engine.has_unfinished():
    tokens += [t for event in engine.step() for t in event.token_ids]
a = torch.randn(64, 64)
bf16 = (a.bfloat16() @ a.bfloat16()).float()
print(json.dumps({"env": os.environ.get("ONEDNN_MAX_CPU_ISA"), "tokens": len(tokens),
                  "bf16_error": float((bf16 - a @ a).abs().max() / (a @ a).abs().max())}))
"""


def test_a_forced_fallback_runs_the_engine_and_bf16_matmuls(tiny_llama_dir, tmp_path):
    """In a fresh process (oneDNN reads its ISA bound once): the engine built from a plan that refuses AMX sets the
    bound before the model loads, generates, and torch's bf16 matmul runs under it."""
    toml = tmp_path / "amx.toml"
    toml.write_text(f'backend = "native"\ndtype = "float32"\n[model]\npath = "{tiny_llama_dir}"\n')
    env = {k: v for k, v in os.environ.items() if k != ONEDNN_ISA_ENV}
    done = subprocess.run([sys.executable, "-c", FORCED, str(toml)], capture_output=True, text=True, timeout=300,
                          env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["env"] == BELOW_AMX and result["tokens"] == 4 and result["bf16_error"] < 0.05
