"""(profile, hardware facts) -> Plan: which backend, on which device, in which dtype, with how big a KV cache.

Every choice carries a reason and every backend not chosen says why not. The backends are built
as `Backend(profile, plan)`, so the Plan (plan.py) is their whole run-time configuration.
"""

from __future__ import annotations

from inferplug import ct2_compute
from inferplug.errors import ProfileError, ResolveError
from inferplug.hardware import GPU, Hardware
from inferplug.kernels import cpu as cpu_kernels
from inferplug.parallel_plan import plan_tensor_parallel
from inferplug.ops.kernel_set import KERNEL_SETS, cpu_kernels_off, kernel_set
from inferplug.memory_plan import (
    DTYPE_BYTES, RESERVE_FIXED, RESERVE_SHARE, DoesNotFit, ModelFacts, draft_facts, gib, model_facts,
    plan_context, plan_memory, weight_bits,
)
from inferplug.plan import Plan
from inferplug.profile import Profile
from inferplug.compute_path_plan import (decode_path_why, native_kv_dtype, onednn_max_isa, prefill_gemm,
                                         recurrent_state_why)
from inferplug.models.config import STATE_SNAPSHOTS
from inferplug.models.registry import runs_document_cache
from inferplug.rag_cache_plan import document_cache_why
from inferplug.weight_format_plan import native_weight_format

BACKENDS = ("native", "ctranslate2", "exllamav2", "openai")
DEFAULT_MAX_NUM_SEQS = {"cpu": 16, "cuda": 256}
# Tokens a step, so the longest prefill chunk: a running stream waits one step per chunk. On the CPU, 256 rows
# already run the GEMMs at their full rate (fbgemm fp16: 98 GF/s a core at 256 rows, 101 at 2048), and the paged
# attention kernel reads a cached prefix once per 8 query rows whatever the chunking: smaller chunks cost prefill
# little (a weight pass a step) and cut the streams' stalls 8x against 2048 (bench/prefill.py --streams).
DEFAULT_BATCHED_TOKENS = {"cpu": 256, "cuda": 8192}
# Prefill tokens a step may carry beside decode rows (0: the whole budget). On the CPU a decode step streams the
# weights once; a dozen prefill rows ride along for about one more step's time (their attention over a long prefix
# included), a 256-token chunk stretches it ~20-45x. So a long prompt's chunks shrink to 16 while streams decode:
# their TPOT ~2.1x alone, against 4.4x at 32 (bench/prefill.py --streams 4 --caps 0,8,16,32, docs/benchmarks.md).
# CUDA: not measured yet, so no cap. An MoE on the CPU takes no cap either: a prompt row costs the experts it picks
# unpacked for its few rows, so a small chunk is dear (16 prompt tokens beside 8 decode rows touch ~100 of
# Qwen3-30B-A3B's 128 experts a layer). Served to 32 clients (docs/benchmarks.md) no cap gave 20.7 output tok/s and
# 326 ms TPOT against 11.8 and 537 at 16, and 3 of the 32 requests timed out in the queue at 16.
DEFAULT_PREFILL_WHILE_DECODING = {"cpu": 16, "cuda": 0}
EXL2_CACHE_BYTES = {"FP16": 2.0, "Q8": 1.0, "Q6": 0.75, "Q4": 0.5}
# Quantized checkpoints the native engine cannot unpack, and the way out.
NATIVE_UNREADABLE = {"exl2": "use exllamav2 on a CUDA GPU"}
# On a CPU, pinning a 16-bit compute dtype is opt-in: it rounds every activation (docs/profiles.md, "Precision").
CPU_LOW_PRECISION = {
    "bfloat16": " (opt-in: bf16 activations and residual; greedy answers can differ from float32's)",
    "float16": " (opt-in: fp16 activations and residual, emulated on most CPUs; greedy answers can differ from float32's)",
}
_TRITON_OPS = ("paged decode (split-K), KV store, RoPE and RMSNorm + residual in Triton (inferplug/kernels), decode "
               "steps replayed from CUDA graphs")
NATIVE_ATTENTION = {  # what each of ops.kernel_set's answers runs (ops.select_ops builds it)
    "cpu-kernels": ("inferplug's C++ kernels take every attention row, prefill too (flash tiles over the paged K/V, "
                    "each row at its own length: batch-invariant), and the KV store, RoPE and RMSNorm; "
                    "attention = 'torch' runs torch's instead"),
    "torch": ("torch's paged attention runs (decode: batched matmuls per KV-head group; prefill: "
              "scaled_dot_product_attention)"),
    "triton": f"Triton kernels on CUDA: prefill and chunked prefill through block tables, {_TRITON_OPS}",
    "flash": f"flash-attn's varlen kernel for prefill; {_TRITON_OPS}",
}


class _Rejected(Exception):
    """This backend cannot run the profile here; the message says why."""


def resolve(profile: Profile, hardware: Hardware, facts: ModelFacts | None = None) -> Plan:
    """The plan for `profile` on `hardware`. ResolveError (with `.rejected`) when no allowed backend can run it."""
    if facts is None and profile.model.kind is not None:
        facts = model_facts(profile)
    _check_format_fits_file(profile, facts)
    order = _preference(profile)
    plans: dict[str, Plan] = {}
    rejected: dict[str, str] = {}
    for name in BACKENDS:
        try:
            plans[name] = _PLANNERS[name](profile, hardware, facts)
        except (_Rejected, DoesNotFit) as exc:
            rejected[name] = str(exc)
    allowed = [profile.backend] if profile.backend != "auto" else order
    chosen = next((name for name in allowed if name in plans), None)
    if chosen is None:
        # auto: every backend's reason, preferred ones first; pinned: the pinned backend's reason only
        shown = allowed + [n for n in BACKENDS if n not in allowed] if profile.backend == "auto" else allowed
        why = {name: rejected[name] for name in shown if name in rejected}
        instead = f" Usable instead: {', '.join(plans)} (set backend accordingly)." if plans else ""
        error = ResolveError(f"profile {profile.name!r} cannot run here. "
                             + "; ".join(f"{name}: {reason}" for name, reason in why.items()) + f".{instead}")
        error.rejected = why  # type: ignore[attr-defined]
        raise error
    plan = plans[chosen]
    for name in BACKENDS:
        if name in plans and name != chosen:
            rejected[name] = (f"usable, but the profile pins backend = {profile.backend!r}" if profile.backend != "auto"
                              else f"usable, but {chosen} ranks first for this profile")
    plan.rejected = rejected
    plan.reasons.insert(0, f"backend {chosen}: " + ("pinned by the profile" if profile.backend != "auto" else
                                                     f"first usable in the order {' > '.join(order)}"))
    if profile.parallel.replicas > 1:
        from inferplug.replica_plan import describe

        plan.reasons.append(describe(profile))
    return plan


def _check_format_fits_file(profile: Profile, facts: ModelFacts | None) -> None:
    """A GGUF holds its own quantization: a checkpoint kind named for it (AWQ, GPTQ, EXL2) is a profile's mistake,
    refused here with the formats a GGUF takes, rather than planned and failed at load."""
    fmt = profile.quantization.format
    if facts is not None and facts.gguf_matrices and fmt in ("awq", "gptq", "exl2"):
        raise ProfileError(f"quantization.format = {fmt!r} names a checkpoint kind, but {profile.model.describe()} "
                           "is a GGUF, which holds its own quantization: set format = \"gguf\" (its blocks as "
                           "stored), \"int8\" or \"int4\" (requantized), or \"none\" (dequantized)")


def _preference(profile: Profile) -> list[str]:
    if profile.model.kind is None:
        return ["openai"]
    fmt = profile.quantization.format
    if fmt == "exl2":
        return ["exllamav2"]  # native and ctranslate2 cannot read it
    if fmt == "gptq":
        return ["native", "exllamav2"]  # ExLlamaV2: the alternative on CUDA
    if fmt == "awq":
        return ["native"]
    if fmt == "ct2-int8":
        return ["ctranslate2", "native"]
    return ["native", "ctranslate2"]


# --- devices, dtypes, attention ----------------------------------------------------------------
def _pick_gpus(profile: Profile, hw: Hardware, cpu_ranks: bool = False) -> list[GPU]:
    """The GPUs to use, most free memory first; [] means the CPU (`cpu_ranks`: where tensor parallel runs there
    too, on a host without GPUs)."""
    tp = profile.parallel.tensor_parallel_size
    if cpu_ranks and not hw.gpus:
        return []
    if tp > len(hw.gpus):
        if tp > 1:
            raise _Rejected(f"tensor_parallel_size = {tp} needs {tp} CUDA GPUs; found {len(hw.gpus)}")
        return []
    return sorted(hw.gpus, key=lambda g: g.free_memory, reverse=True)[:tp]


def _device(gpus: list[GPU], hw: Hardware) -> tuple[str, str, int, str]:
    """(device, kind, available bytes, reason)."""
    if not gpus:
        return "cpu", "cpu", hw.ram_available, f"device cpu: no CUDA GPU found; {gib(hw.ram_available)} RAM free"
    available = min(g.free_memory for g in gpus) * len(gpus)  # tensor parallel splits evenly
    if len(gpus) == 1:
        g = gpus[0]
        return g.device, "cuda", available, f"device {g.device}: {g.name}, {gib(g.free_memory)} free"
    names = ", ".join(f"{g.device} {g.name}" for g in gpus)
    return "cuda", "cuda", available, f"device cuda: tensor parallel over {len(gpus)} GPUs ({names})"


def _dtype(profile: Profile, gpus: list[GPU], hw: Hardware) -> tuple[str, str]:
    if gpus:
        cap = min(g.capability for g in gpus)
        if profile.dtype == "bfloat16" and cap < (8, 0):
            raise _Rejected(f"dtype bfloat16 needs compute capability >= 8.0, the GPU has {cap[0]}.{cap[1]}; "
                            "use float16")
        if profile.dtype != "auto":
            return profile.dtype, f"dtype {profile.dtype}: pinned by the profile"
        if cap >= (8, 0):
            return "bfloat16", f"dtype bfloat16: compute capability {cap[0]}.{cap[1]} >= 8.0"
        return "float16", f"dtype float16: compute capability {cap[0]}.{cap[1]} has no fast bf16"
    if profile.dtype != "auto":
        return profile.dtype, f"dtype {profile.dtype}: pinned by the profile" + CPU_LOW_PRECISION.get(profile.dtype, "")
    return "float32", ("dtype float32: on a CPU activations and accumulation stay fp32 whatever the ISA (bf16 "
                       "activations changed SmolLM2's greedy answers; fewer weight bytes come from the weight format)")


def _attention(profile: Profile, gpus: list[GPU], hw: Hardware, dtype: str) -> tuple[str, str]:
    """The native engine's kernel set (ops.kernel_set decides) and why."""
    choice = profile.attention
    kv_dtype = None if profile.cache.kv_dtype == "auto" else profile.cache.kv_dtype
    try:
        chosen = kernel_set(choice, "cuda" if gpus else "cpu", dtype, kv_dtype, hw)
    except ProfileError as exc:
        raise _Rejected(str(exc)) from None
    if choice == "auto" and chosen == "torch":
        why = "triton is not installed" if gpus else cpu_kernels_off("cpu", dtype, kv_dtype, hw)
        return chosen, f"attention torch: {why}, so {NATIVE_ATTENTION['torch']}"
    if choice == "auto":
        return chosen, f"attention {chosen}: {NATIVE_ATTENTION[chosen]}"
    if choice not in KERNEL_SETS:  # an old name: kernel_set warned
        return chosen, f"attention {chosen}: attention = {choice!r} is the old name of {chosen!r} here; {NATIVE_ATTENTION[chosen]}"
    if choice == "torch" and not cpu_kernels_off("cpu" if not gpus else "cuda", dtype, kv_dtype, hw):
        return chosen, (f"attention torch: pinned by the profile (until this release 'torch' ran the C++ kernels on "
                        f"this CPU: 'cpu-kernels' or 'auto' runs them); {NATIVE_ATTENTION['torch']}")
    return chosen, f"attention {chosen}: pinned by the profile; {NATIVE_ATTENTION[chosen]}"


def _single_device(profile: Profile) -> list[str]:
    """The problem for a backend that runs on one device when the profile asks for tensor parallelism."""
    tp = profile.parallel.tensor_parallel_size
    if tp == 1:
        return []
    return [f"runs on one device; tensor_parallel_size = {tp} is not supported (set it to 1, or use exllamav2, "
            "which splits GPTQ/EXL2 models over several GPUs)"]


# --- the backends ------------------------------------------------------------------------------
def _plan_native(profile: Profile, hw: Hardware, facts: ModelFacts | None) -> Plan:
    fmt = profile.quantization.format
    problems = []
    if fmt in NATIVE_UNREADABLE:
        problems.append(f"cannot read {fmt.upper()} weights; {NATIVE_UNREADABLE[fmt]}")
    elif fmt == "ct2-int8":
        problems.append("cannot read ct2-int8 weights (use ctranslate2)")
    if not hw.has("torch"):
        problems.append("needs torch (pip install torch==2.13.0 'inferplug[native]')")
    gpus = _pick_gpus(profile, hw, cpu_ranks=True)
    parallel = plan_tensor_parallel(profile.parallel.tensor_parallel_size, hw, facts, bool(gpus))
    problems += [parallel.problem] if parallel.problem else []
    if problems:
        raise _Rejected("; ".join(problems))
    dtype, dtype_why = _dtype(profile, gpus, hw)
    attention, attention_why = _attention(profile, gpus, hw, dtype)
    if profile.cache.kv_dtype == "float8_e4m3" and not gpus:
        raise _Rejected("kv_dtype = 'float8_e4m3' needs a CUDA GPU; none found (use auto, float16 or bfloat16)")
    kv_dtype, kv_why = native_kv_dtype(profile, dtype, attention == "cpu-kernels")
    weight_format, format_why = native_weight_format(profile, gpus, hw, dtype)
    bits, bits_why = weight_bits(profile, "native", dtype, facts, weight_format, "cuda" if gpus else "cpu",
                                 mxfp4_blocks=cpu_kernels.runs_on("cpu", hw))
    plan = _local_plan("native", profile, hw, facts, gpus, dtype, attention, bits, None,
                       [dtype_why, attention_why, kv_why, *format_why, f"weights: {bits_why}",
                        *([parallel.reason] if parallel.reason else [])], draft=draft_facts(profile), kv_dtype=kv_dtype)
    plan.weight_format = weight_format
    plan.threads_per_rank = parallel.threads_per_rank
    plan.reasons.append(document_cache_why(profile.cache, facts.family if facts is not None else ""))
    plan.reasons += recurrent_state_why(facts.family, plan.prefix_caching) if facts is not None and facts.family else []
    if not gpus:
        plan.onednn_max_isa, amx_why = onednn_max_isa(hw)
        plan.reasons += [amx_why] if amx_why else []
    plan.reasons += [decode_path_why(facts.family, attention)] if facts is not None and facts.family else []
    plan.prefill_gemm, prefill_why = prefill_gemm(profile, hw, None if gpus else weight_format, facts,
                                                  profile.native.num_threads or parallel.threads_per_rank or hw.cpu_count)
    plan.reasons += [prefill_why] if prefill_why else []
    return plan


def _plan_ctranslate2(profile: Profile, hw: Hardware, facts: ModelFacts | None) -> Plan:
    fmt = profile.quantization.format
    problems = [] if hw.has("ctranslate2") else ["not installed (pip install 'inferplug[ctranslate2]')"]
    if fmt in ("awq", "gptq", "exl2"):
        problems.append(f"cannot load {fmt.upper()} weights; it converts unquantized HF or GGUF models")
    if facts is not None and facts.gguf_matrices and facts.family not in ("", *ct2_compute.GGUF_FAMILIES):
        problems.append(f"converts a GGUF of {', '.join(ct2_compute.GGUF_FAMILIES)} models only (through an HF "
                        f"dir), and this is a {facts.family} model: use the native backend")
    elif facts is not None and not facts.gguf_matrices and facts.family not in ("", *ct2_compute.HF_FAMILIES):
        problems.append(f"its converter has no loader for a {facts.family} model (it converts "
                        f"{', '.join(ct2_compute.HF_FAMILIES)} ones): use the native backend")
    problems += _single_device(profile)
    if problems:
        raise _Rejected("; ".join(problems))
    opts = profile.ctranslate2
    gpus = [] if opts.device == "cpu" else _pick_gpus(profile, hw)
    if opts.device == "cuda" and not gpus:
        raise _Rejected("[ctranslate2] device = 'cuda' but no CUDA GPU was found")
    dtype, dtype_why = _dtype(profile, gpus, hw)
    device = "cuda" if gpus else "cpu"
    quantized = fmt in ("int8", "ct2-int8", "gguf", "int4")
    compute_type, compute_why = ct2_compute.choose_compute_type(opts.compute_type, quantized, dtype, device,
                                                                hw.ct2_compute_types_on(device))
    if compute_type is None:
        raise _Rejected(compute_why)
    if ct2_compute.activation_dtype(compute_type) != dtype:
        dtype = ct2_compute.activation_dtype(compute_type)
        dtype_why = f"dtype {dtype}: CTranslate2 computes {compute_type} in it"
    reasons = [dtype_why, compute_why]
    if profile.attention != "auto":
        reasons.append(f"attention = {profile.attention!r} is ignored: CTranslate2 uses its own")
    return _local_plan("ctranslate2", profile, hw, facts, gpus, dtype, "ctranslate2",
                       ct2_compute.weight_bits(compute_type), compute_type, reasons)


def _plan_exllamav2(profile: Profile, hw: Hardware, facts: ModelFacts | None) -> Plan:
    fmt = profile.quantization.format
    kv_bytes = EXL2_CACHE_BYTES[profile.exllamav2.cache_mode]
    problems = []
    if fmt not in ("gptq", "exl2"):
        label = "unquantized" if fmt == "none" else fmt.upper()
        problems.append(f"ExLlamaV2 loads GPTQ and EXL2 weights, not {label}")
    if not hw.gpus:
        need = "" if problems else _gpu_need(profile, facts, kv_bytes)  # only worth saying for GPTQ/EXL2
        problems.insert(0, f"needs a CUDA GPU; none found{need}")
    if not hw.has("exllamav2"):
        problems.append("not installed (pip install 'inferplug[exllamav2]' on a CUDA machine)")
    if problems:
        raise _Rejected("; ".join(problems))
    gpus = _pick_gpus(profile, hw)
    bits, bits_why = weight_bits(profile, "exllamav2", "float16")
    attention = "flash" if hw.has("flash_attn") else "sdpa"
    reasons = ["dtype float16: ExLlamaV2 computes in fp16", f"attention {attention}: ExLlamaV2's own kernels",
               f"weights: {bits_why}", f"KV cache mode {profile.exllamav2.cache_mode}"]
    return _local_plan("exllamav2", profile, hw, facts, gpus, "float16", attention, bits, None, reasons, kv_bytes)


def _plan_openai(profile: Profile, hw: Hardware, facts: ModelFacts | None) -> Plan:
    problems = []
    if profile.backend != "openai":
        problems.append("auto never sends a local model to a remote server; set backend = \"openai\" to use one")
    if not hw.has("httpx"):
        problems.append("needs httpx (pip install 'inferplug[openai]')")
    if problems:
        raise _Rejected("; ".join(problems))
    limits = profile.limits
    return Plan(
        backend="openai", device="remote", dtype="auto", attention="remote",
        max_model_len=limits.max_model_len or profile.model.context_length or 0,
        max_num_seqs=limits.max_num_seqs or 64, max_num_batched_tokens=limits.max_num_batched_tokens or 0,
        prefix_caching=profile.cache.prefix_caching, rag_document_cache=profile.cache.rag_document_cache,
        reasons=[f"remote OpenAI-compatible server at {profile.openai.base_url}; memory is the server's concern"],
    )


_PLANNERS = {"native": _plan_native, "ctranslate2": _plan_ctranslate2, "exllamav2": _plan_exllamav2,
             "openai": _plan_openai}


def _local_plan(backend: str, profile: Profile, hw: Hardware, facts: ModelFacts | None, gpus: list[GPU],
                dtype: str, attention: str, bits: float, compute_type: str | None, reasons: list[str],
                kv_bytes: float | None = None, draft: ModelFacts | None = None, kv_dtype: str | None = None) -> Plan:
    if facts is None:
        raise _Rejected("the profile has no model source to plan memory for")
    device, kind, available, device_why = _device(gpus, hw)
    kv_dtype = kv_dtype or (dtype if profile.cache.kv_dtype == "auto" else profile.cache.kv_dtype)
    reasons = [device_why, *reasons]
    max_len, context_why = plan_context(profile, facts)
    reasons.append(context_why)
    seqs = profile.limits.max_num_seqs or DEFAULT_MAX_NUM_SEQS[kind]
    batched = max(profile.limits.max_num_batched_tokens or DEFAULT_BATCHED_TOKENS[kind], seqs)
    # the document cache keeps a document's every layer; else the sliding-window layers keep only their window
    windows_apart = backend == "native" and not runs_document_cache(profile.cache.rag_document_cache, facts.family,
                                                                     profile.parallel.tensor_parallel_size)
    memory = plan_memory(profile, facts, device=device, kind=kind, available=available, bits=bits,
                         kv_dtype_bytes=kv_bytes or DTYPE_BYTES[kv_dtype], context_tokens=max_len,
                         useful_tokens=seqs * max_len, draft=draft, rope_tables=backend == "native",
                         # a hybrid model's states: the running sequences' and the prefix cache's snapshots
                         seqs=seqs + STATE_SNAPSHOTS * profile.cache.prefix_caching if backend == "native" else 0,
                         window_pool=(seqs, max(batched, profile.cache.block_size)) if windows_apart else None)
    if memory.cache_tokens < max_len:
        fix = "free memory" if profile.cache.memory == "auto" else "raise cache.memory"
        reasons.append(f"max_model_len {memory.cache_tokens}: the KV cache holds only that many tokens "
                       f"({fix} for the full {max_len})")
        max_len = memory.cache_tokens
    memory.seqs_at_full_context = memory.cache_tokens // max_len
    reasons.append(f"memory: {memory.summary()}; {memory.seqs_at_full_context} sequence(s) at the full "
                   f"{max_len}-token context (architecture from {facts.origin})")
    from inferplug.sources import cached_path

    return Plan(
        backend=backend, device=device, dtype=dtype, attention=attention, block_size=profile.cache.block_size,
        num_kv_blocks=memory.cache_tokens // profile.cache.block_size, max_model_len=max_len, max_num_seqs=seqs,
        max_num_batched_tokens=batched, kv_dtype=kv_dtype, compute_type=compute_type,
        max_prefill_tokens_while_decoding=_prefill_while_decoding(profile.limits, kind, facts),
        tensor_parallel_size=profile.parallel.tensor_parallel_size, prefix_caching=profile.cache.prefix_caching,
        rag_document_cache=profile.cache.rag_document_cache, model_path=cached_path(profile.model),
        memory=memory, reasons=reasons,
    )


def _prefill_while_decoding(limits, kind: str, facts: ModelFacts) -> int:
    """The profile's limits.max_prefill_tokens_while_decoding, or the device kind's default (0: no cap; an MoE's
    is 0)."""
    if limits.max_prefill_tokens_while_decoding is not None:
        return limits.max_prefill_tokens_while_decoding
    return 0 if facts.num_experts else DEFAULT_PREFILL_WHILE_DECODING[kind]


def _gpu_need(profile: Profile, facts: ModelFacts | None, kv_bytes: float) -> str:
    """What ExLlamaV2 would need: weights + reserve + KV for one full-context sequence."""
    if facts is None:
        return ""
    bits, _ = weight_bits(profile, "exllamav2", "float16")
    weights = facts.num_parameters * bits / 8
    ctx, _ = plan_context(profile, facts)
    kv = facts.kv_bytes_per_token(kv_bytes) * ctx
    need = weights * (1 + RESERVE_SHARE["cuda"]) + RESERVE_FIXED["cuda"] + kv
    return (f" (it would need one with about {gib(need)} free: {profile.quantization.format.upper()} weights "
            f"{gib(weights)} + KV for one {ctx}-token sequence {gib(kv)} + reserve)")
