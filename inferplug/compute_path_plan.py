"""Compute-path choices of the native engine on the CPU, and why: the K/V pools' dtype, how block layers multiply
prompt rows, and how far torch's oneDNN may go. Each is a default only where the quality rule admits it
(docs/profiles.md, "Quality")."""

from __future__ import annotations

from typing import TYPE_CHECKING

from inferplug.hardware import Hardware
from inferplug.host_timings import prefill_timings
from inferplug.profile import Profile

if TYPE_CHECKING:
    from inferplug.memory_plan import ModelFacts


# The prompt-row paths a default may take (block_linear.PREFILL_GEMMS), most accurate first, with the quality rule's
# figure for each (docs/profiles.md, "Quality"). int8 is left out: int8 prompt activations are 1.6-2.5x Q8_0's KLD
# on SmolLM2 and lose its factual answers.
PREFILL_RULE = {"float32": "the reference arithmetic",
                "bfloat16": "vdpbf16ps or FMAs on bf16-rounded x and w, float32 sums: KLD 1.1e-4 on SmolLM2",
                "bfloat16-onednn": "torch's bf16 matmul (oneDNN; AMX tiles where granted), float32 sums, bf16 out: "
                                   "KLD 2.5e-4 on SmolLM2; an MoE layer's experts take inferplug's bfloat16 kernel, "
                                   "all of a layer's experts in one call"}


BLOCK_FORMATS = ("int4", "int8", "gguf", "awq", "gptq")  # the weight formats block layers run on the CPU
# auto takes the most accurate path that times within this factor of the fastest: a less accurate path must win by
# more than a shared host's timing noise (on an AVX2 EPYC, bfloat16's FMAs timed 8.6 ms against float32's 8.9)
ACCURACY_MARGIN = 1.10


def prefill_gemm(profile: Profile, hw: Hardware, cpu_format: str | None, facts: ModelFacts | None,
                 threads: int) -> tuple[str, str | None]:
    """How the CPU's block layers multiply prompt rows, and the plan's reason (None where none runs: `cpu_format`,
    the plan's weight format on the CPU, is None on a GPU or not a block format). A pin wins. auto: the most
    accurate path of PREFILL_RULE within ACCURACY_MARGIN of the fastest, timed on this host under `threads`
    threads on a layer of the model's width (host_timings.py); untimed (another host's facts, no width, or no
    kernels): bfloat16 where the CPU has AVX512_BF16, else float32."""
    blocks = cpu_format in BLOCK_FORMATS
    path, why = _prefill_gemm(profile, hw, facts.hidden_size if blocks and facts else 0, threads)
    return path, f"prefill: the block layers multiply prompt rows in {path} ({why})" if blocks else None


def _prefill_gemm(profile: Profile, hw: Hardware, width: int, threads: int) -> tuple[str, str]:
    pinned = profile.native.prefill_gemm
    if pinned != "auto":
        return pinned, f"[native] prefill_gemm = {pinned!r}"
    timed = prefill_timings(hw, threads, width, tuple(PREFILL_RULE)) if width else None
    timed = {path: seconds for path, seconds in (timed or {}).items() if path in PREFILL_RULE}
    if timed:
        fastest = min(timed.values())
        best = next(path for path in PREFILL_RULE if timed.get(path, float("inf")) <= fastest * ACCURACY_MARGIN)
        shown = ", ".join(f"{path} {seconds * 1e3:.1f} ms" for path, seconds in sorted(timed.items(),
                                                                                   key=lambda kv: kv[1]))
        return best, (f"auto: timed once on this host ({shown}), the most accurate within "
                      f"{ACCURACY_MARGIN - 1:.0%} of the fastest; {PREFILL_RULE[best]}; int8 is no candidate (it "
                      "fails the quality rule)")
    if "avx512_bf16" in hw.cpu_flags:
        return "bfloat16", "auto, untimed: AVX512_BF16's vdpbf16ps, float32 sums; KLD 1.1e-4 on SmolLM2"
    return "float32", "auto, untimed: this CPU has no AVX512_BF16, so bf16 would be no faster"


def native_kv_dtype(profile: Profile, dtype: str, cpu_kernels_run: bool) -> tuple[str, str]:
    """The native engine's K/V pool dtype and why. auto: float16 where the C++ CPU kernels run (they store K/V
    rounded to fp16 and widen it back to fp32 as attention reads it: half the bytes a token, llama.cpp's default
    cache type), else the compute dtype (the torch path's prefill attends to the unrounded K/V of its own chunk)."""
    pinned = profile.cache.kv_dtype
    if pinned != "auto":
        return pinned, f"kv_dtype {pinned}: pinned by the profile"
    if cpu_kernels_run:
        return "float16", ("kv_dtype float16: inferplug's CPU kernels store K/V rounded to fp16 and read it back to "
                           "fp32 (accumulation stays fp32): half the cache bytes a token; [cache] kv_dtype = "
                           "\"float32\" keeps fp32")
    return dtype, f"kv_dtype {dtype}: the compute dtype"


ONEDNN_ISA_ENV = "ONEDNN_MAX_CPU_ISA"  # read by oneDNN once, at its first matmul
BELOW_AMX = "AVX512_CORE_BF16"


def onednn_max_isa(hw: Hardware) -> tuple[str | None, str]:
    """The ISA torch's oneDNN is held to, or None (its own choice), and why. inferplug's kernels issue no AMX; oneDNN
    does for bf16 matmuls where the CPU has it. It asks for the tiles itself too; the bound makes the fallback
    explicit and visible, and lets INFERPLUG_NO_AMX=1 keep it off tiles on a host where they misbehave although
    granted."""
    if hw.amx_tiles is None:
        return None, ""
    if hw.amx_tiles == "granted":
        return None, "AMX: tile data granted; torch's oneDNN may use the tiles for bf16 matmuls"
    return BELOW_AMX, (f"AMX advertised but unusable ({hw.amx_tiles}): torch's oneDNN is held to {BELOW_AMX} "
                       f"({ONEDNN_ISA_ENV}, unless set already: a bound of the user's stands); inferplug's kernels "
                       "use AVX-512, which needs no tiles")


def recurrent_state_why(family_name: str, prefix_caching: bool) -> list[str]:
    """What a family with a state per sequence (Qwen3.5's DeltaNet layers) runs without, and how its prefix cache
    works (engine/state_snapshots.py); none for the others."""
    from inferplug.models.config import STATE_SNAPSHOTS
    from inferplug.models.registry import family

    recurrent = family(family_name).recurrent_why
    if not recurrent:
        return []
    return [f"no speculative decoding or beam search: {recurrent}"] + (
        [f"prefix caching: a hit resumes from a snapshot of the DeltaNet state at a 64-token point, {STATE_SNAPSHOTS} "
         "kept beside the running sequences' (memory: DeltaNet states)"] if prefix_caching else [])


def decode_path_why(family_name: str, attention: str) -> str:
    """Which decode path the model family takes on the CPU kernels: every layer in one kernel call, or layer by
    layer (models/family.py fused_decode)."""
    from inferplug.models.registry import family

    fam = family(family_name)
    if attention != "cpu-kernels":
        return f"model family: {fam.name}, layer by layer on the {attention} ops"
    if fam.fused_decode:
        return (f"model family: {fam.name}; decode steps of block weights run every layer in one kernel call "
                "(decode_layers, MoE layers too: one expert call a layer)")
    return f"model family: {fam.name}; decode runs layer by layer: decode_layers does not take {fam.unfused_why} yet"
