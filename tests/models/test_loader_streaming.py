"""A mid-size AWQ checkpoint (two decoder layers at 7B width) loads one module at a time: its peak memory, in a
fresh process (bench/awq_load_memory.py's VmHWM), stays below what it returns plus one decoder layer's packed
words, which a whole-checkpoint copy would exceed; a cached load maps the conversion and reads nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from inferplug.benchmark.random_models import write_random_checkpoint
from inferplug.models.config import ModelConfig

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20
GEOMETRY = ModelConfig(architecture="llama", vocab_size=1024, hidden_size=4096, intermediate_size=14336,
                       num_hidden_layers=2, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                       max_position_embeddings=4096)


@pytest.fixture(scope="module")
def awq_7b_width(tmp_path_factory) -> Path:
    return write_random_checkpoint(tmp_path_factory.mktemp("awq-7b-width"), GEOMETRY, "awq")


def load_in_child(model_dir: Path, home: Path) -> dict:
    env = {**os.environ, "INFERPLUG_HOME": str(home), "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("INFERPLUG_CONVERSION_CACHE_GIB", None)
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "awq_load_memory.py"), "--child", str(model_dir)],
                            capture_output=True, text=True, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_peak_memory_holds_no_copy_of_the_checkpoint(cpu_kernel_ops, awq_7b_width, tmp_path):
    checkpoint = sum(f.stat().st_size for f in awq_7b_width.glob("*.safetensors"))
    one_layer = max(f.stat().st_size for f in awq_7b_width.glob("model-layer*.safetensors"))
    first = load_in_child(awq_7b_width, tmp_path)
    assert first["loaded_bytes"] > checkpoint  # Q4_1's 5 bits a weight against AWQ's 4, and fp32 floats
    assert first["peak_bytes"] < first["loaded_bytes"] + one_layer + 32 * MiB < first["loaded_bytes"] + checkpoint
    cached = load_in_child(awq_7b_width, tmp_path)
    assert cached["loaded_bytes"] == first["loaded_bytes"]
    assert cached["peak_bytes"] < 16 * MiB  # mapped, not read: the weights' pages come in as they are used
