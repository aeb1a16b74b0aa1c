"""Two layers at Llama-7B width, two at Qwen3-30B-A3B's (an MoE of 128 experts), written as Q4_K_M-style GGUFs of
random weights, two at gpt-oss-20b's (32 MXFP4 experts, Q8_0 elsewhere, as its files ship), six at Gemma 4
26B-A4B's (five window layers and a full one of their own head sizes, 16 of its experts beside the dense MLP; its
704- and 2112-wide rows in llama.cpp's fallback types), four at Qwen3.5-9B's (three Gated DeltaNet layers and a
gated attention one; the plan counts their states) and four at Qwen3.5-35B-A3B's (16 of its experts and the shared
one in every layer): they load in the file's bits, no matrix as float, and the process's peak RSS after load and a
first request is what `resolve` promised."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from inferplug.kernels import cpu as cpu_kernels

pytestmark = [pytest.mark.slow, pytest.mark.smollm2,  # the vocabulary: SmolLM2's tokenizer
              pytest.mark.skipif(cpu_kernels.ops() is None, reason="the CPU kernels do not run here (no AVX2/FMA/F16C)")]

GEOMETRY = dict(architecture="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=2,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
                rms_norm_eps=1e-5, rope_theta=1e6)  # fmt: skip


def wide_config(geometry: str, vocab: int):
    """Two layers of `geometry`: Llama-7B's width, or Qwen3-30B-A3B's or gpt-oss-20b's (bench/real_size.py's); six of
    Gemma 4 26B-A4B's with 16 of its experts."""
    import dataclasses

    from inferplug.benchmark.real_size_files import GEOMETRIES, config
    from inferplug.models.config import ModelConfig

    if geometry == "llama-7b":
        return ModelConfig(vocab_size=vocab, **GEOMETRY)
    if geometry.startswith("gemma4"):
        return config(dataclasses.replace(GEOMETRIES[geometry], layers=6, experts=16, vocab=vocab))
    if geometry.startswith("qwen35"):
        experts = min(16, GEOMETRIES[geometry].experts)
        return config(dataclasses.replace(GEOMETRIES[geometry], layers=4, vocab=vocab, experts=experts))
    return config(dataclasses.replace(GEOMETRIES[geometry], layers=2, vocab=vocab))


@pytest.fixture(scope="module", params=["llama-7b", "qwen3-30b-a3b", "gpt-oss-20b", "gemma4-26b-a4b", "qwen35-9b",
                                        "qwen35-35b-a3b"])
def wide_gguf(request, smollm2_gguf, tmp_path_factory) -> tuple[Path, int]:
    """The file, and the block layers it loads as: a layer's attention two (a DeltaNet layer's five: qkv, z, b, a,
    out), its MLP two or 2 x its experts (two more for Gemma 4's dense MLP or Qwen3.5-MoE's shared expert), the
    embedding and the head."""
    from inferplug.benchmark.random_gemma4 import write_random_gemma4_gguf
    from inferplug.benchmark.random_models import write_random_gguf
    from inferplug.benchmark.random_qwen35 import write_random_qwen35_gguf
    from inferplug.models.gguf import read_gguf

    tokenizer = {k: v for k, v in read_gguf(smollm2_gguf).metadata.items() if k.startswith("tokenizer.")}
    config = wide_config(request.param, len(tokenizer["tokenizer.ggml.tokens"]))
    out = tmp_path_factory.mktemp("wide") / f"{request.param}.gguf"
    writer = {"gemma4": write_random_gemma4_gguf, "qwen35": write_random_qwen35_gguf,
              "qwen35moe": write_random_qwen35_gguf}.get(config.family, write_random_gguf)
    writer(out, config, tokenizer)
    beside = config.dense_beside_moe or config.shared_expert_intermediate_size
    mlp = 2 * config.num_experts + (2 if beside else 0) if config.num_experts else 2
    return out, 2 + sum((5 if config.is_linear_layer(i) else 2) + mlp for i in range(config.num_hidden_layers))


def test_a_wide_q4_k_m_gguf_loads_in_its_bits_within_the_plans_memory(wide_gguf, tmp_path):
    wide_gguf, block_layers = wide_gguf
    profile = tmp_path / "wide.toml"
    profile.write_text(f'backend = "native"\n[model]\npath = "{wide_gguf}"\n[quantization]\nformat = "gguf"\n'
                       '[cache]\nmemory = "128MiB"\n[limits]\nmax_model_len = 1024\nmax_num_seqs = 4\n')
    probe = Path(__file__).with_name("rss_probe.py")
    home = {**os.environ, "INFERPLUG_HOME": str(tmp_path / "home")}  # a first load: it converts, saves and maps the entry
    done = subprocess.run([sys.executable, str(probe), str(profile)], capture_output=True, text=True, timeout=600, env=home)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["float_matrices"] == 0 and result["layers"] == block_layers
    planned = result["planned"] - result["untaken_snapshots"]  # a hybrid's snapshots: planned, never taken here
    assert abs(result["peak_rss"] - planned) <= 0.10 * planned, result
