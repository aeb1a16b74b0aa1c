"""The hardware the resolver tests inject: a CPU with given flags, GPUs, and SmolLM2's architecture facts."""

from __future__ import annotations

from inferplug.hardware import GPU, Hardware
from inferplug.memory_plan import ModelFacts

GiB = 1 << 30
GB = 10**9
ALL_CPU_PACKAGES = frozenset({"torch", "transformers", "gguf", "ctranslate2", "httpx", "openai"})
SMOLLM2 = ModelFacts(134_515_008, 30, 3, 64, 8192, "test", num_attention_heads=9)
# What ctranslate2 4.8 reports on an AMD x86 CPU (no bfloat16 there, even with AVX512_BF16), and on a recent GPU
CT2_CPU = frozenset({"float32", "int8", "int8_float32"})
CT2_GPU = frozenset({"float32", "float16", "bfloat16", "int8", "int8_float32", "int8_float16", "int8_bfloat16"})


def cpu(flags=("avx2", "fma"), packages=ALL_CPU_PACKAGES, ram_free=20 * GiB, ct2=CT2_CPU) -> Hardware:
    return Hardware(cpu_model="test cpu", cpu_flags=frozenset(flags), cpu_count=8, ram_total=32 * GiB,
                    ram_available=ram_free, packages=frozenset(packages), ct2_compute_types={"cpu": ct2})


def with_gpus(*gpus: GPU, packages=ALL_CPU_PACKAGES | {"triton"}) -> Hardware:
    return Hardware(cpu_flags=frozenset({"avx2"}), cpu_count=16, ram_total=64 * GiB, ram_available=60 * GiB,
                    gpus=gpus, cuda_version="12.4", packages=frozenset(packages),
                    ct2_compute_types={"cpu": CT2_CPU, "cuda": CT2_GPU})


RTX_4090 = GPU(0, "NVIDIA GeForce RTX 4090", (8, 9), 24 * GB, 23 * GB)
A100_80 = GPU(0, "NVIDIA A100-SXM4-80GB", (8, 0), 80 * GB, 79 * GB)
T4 = GPU(0, "Tesla T4", (7, 5), 16 * GB, 15 * GB)
