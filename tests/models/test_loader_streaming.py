"""A mid-size AWQ checkpoint (two decoder layers at 7B width) loads one module at a time: its peak memory, in a
fresh process (bench/awq_load_memory.py's VmHWM), stays below what it returns plus one decoder layer's packed
words, which a whole-checkpoint copy would exceed; a cached load maps the conversion and reads nothing."""

from __future__ import annotations

import dataclasses
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


BF16_GEOMETRY = dataclasses.replace(GEOMETRY, vocab_size=49152, num_hidden_layers=8)  # SmolLM2's tokenizer


def test_a_bf16_checkpoint_is_never_whole_in_fp32(cpu_kernel_ops, smollm2_gguf, tmp_path_factory, tmp_path):
    """An unquantized bf16 HF dir (8 layers at Llama-7B width, as most releases ship) on the CPU's fp32 plan with fp16
    linears: the loader keeps the bf16 and the model makes each layer's fp16 layers as it builds the layer, so a first
    load peaks at the plan plus one layer's build in fp32 (its weights, and the fused q/k/v and gate/up copies), and
    the head's Q8_0 blocks are packed a few rows at a time: 6.2 GB against a plan of 5.6 and a bound of 7.4. Loads
    made before converted the whole checkpoint to fp32 first and peaked at 9.5 GB here; with the layers converted as
    built but the head packed whole, 7.4."""
    from inferplug.models.loader import load_tokenizer

    model_dir = write_random_checkpoint(tmp_path_factory.mktemp("bf16-7b-width"), BF16_GEOMETRY, "bf16",
                                        load_tokenizer(smollm2_gguf))
    profile = tmp_path / "bf16.toml"
    profile.write_text(f'backend = "native"\n[model]\npath = "{model_dir}"\n[cache]\nmemory = "128MiB"\n'
                       '[limits]\nmax_model_len = 1024\nmax_num_seqs = 4\n')
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "models" / "rss_probe.py"), str(profile)],
                          capture_output=True, text=True, env={**os.environ, "INFERPLUG_HOME": str(tmp_path / "home")})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    layer = sum(rows * cols for rows, cols in BF16_GEOMETRY.linear_shapes().values())
    assert result["peak_rss"] < result["planned"] + 4 * 2 * layer, result
