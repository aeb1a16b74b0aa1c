"""The resolver's tensor-parallel lines for the native engine: does the size split this model, and on a CPU how
many threads each rank gets (engine/parallel runs one process per rank)."""

from __future__ import annotations

from dataclasses import dataclass

from inferplug.hardware import Hardware
from inferplug.memory_plan import ModelFacts
from inferplug.models.shard import check_tensor_parallel


@dataclass
class ParallelPlan:
    problem: str | None  # why the native engine cannot run this size (None: it can)
    reason: str = ""
    threads_per_rank: int = 0  # CPU ranks: their torch threads (0: torch's default, or one rank)


def plan_tensor_parallel(tp: int, hw: Hardware, facts: ModelFacts | None, on_gpus: bool) -> ParallelPlan:
    if tp == 1:
        return ParallelPlan(None)
    if facts is not None:
        heads = facts.num_attention_heads or facts.num_key_value_heads  # [model.hints] may not give the heads
        problem = check_tensor_parallel(heads, facts.num_key_value_heads, tp, facts.family, facts.layer_kv_heads)
        if problem:
            return ParallelPlan(problem)
        if facts.mxfp4_parameters:
            return ParallelPlan("tensor parallel does not split an HF checkpoint's MXFP4 experts yet; set "
                                "tensor_parallel_size = 1, or use the model's GGUF (tensor parallel dequantizes it)")
    split = ("q/k/v and gate/up by columns, o and down by rows with an all-reduce after each, the KV pool by KV "
             "head, the embedding and head by vocabulary; no RAG document cache (it would copy KV on rank 0 only)")
    if on_gpus:
        return ParallelPlan(None, f"tensor parallel {tp}: one process per GPU over NCCL; {split}")
    threads = max(hw.cpu_count // tp, 1)
    oversubscribed = " (fewer cores than ranks: they share)" if hw.cpu_count < tp else ""
    return ParallelPlan(None, f"tensor parallel {tp} on the CPU: one process per rank over gloo, {threads} thread(s) "
                              f"each of {hw.cpu_count} cores{oversubscribed}; {split}. On one host this adds "
                              "all-reduces to every step rather than speed (bench/tensor_parallel.py)", threads)


def doctor_line(hw: Hardware) -> str:
    """What `inferplug doctor` says about [parallel] tensor_parallel_size on this machine (nothing imported)."""
    if not hw.has("torch"):
        return "off: the native engine needs torch (pip install torch==2.13.0 'inferplug[native]')"
    if len(hw.gpus) > 1:
        return f"native engine, up to {len(hw.gpus)} ranks over NCCL (one per GPU); sizes must divide the heads"
    return (f"native engine on the CPU over gloo: ranks share the {hw.cpu_count} cores (no speed-up on one host, "
            "see docs/benchmarks.md); sizes must divide the heads")
