"""What ChatInferPlug and InferPlugLLM share: the profile, its shared backend, sampling options."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from inferplug.rag.layout import DocumentMemory, format_documents


class InferPlugFields(BaseModel):
    """Mixed into the LangChain classes (pydantic fields + the backend they share per profile)."""

    model_config = ConfigDict(arbitrary_types_allowed=True, protected_namespaces=())

    profile: Any = None
    """A profile name, a path to a TOML profile, or a Profile object (None: the default profile)."""
    model: str | None = None
    """The served model name; filled from the backend. As a constructor argument alone it names the profile."""
    temperature: float | None = None
    max_tokens: int | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: list[str] | None = None
    streaming: bool = False
    document_memory: DocumentMemory = Field(default_factory=DocumentMemory, exclude=True)

    @model_validator(mode="after")
    def _load_profile(self) -> InferPlugFields:
        """Check the profile now (a bad name fails at construction); load the model on first use."""
        from inferplug.frontend.binding import bind_profile

        self.profile, self.model = bind_profile(self.profile, self.model)
        return self

    @property
    def backend(self) -> Any:
        from inferplug.backends.registry import get_backend

        return get_backend(self.profile)

    def _options(self, stop: list[str] | None, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Sampling options for one call: call kwargs > constructor fields > profile defaults."""
        options = {"temperature": self.temperature, "max_tokens": self.max_tokens, "top_p": self.top_p,
                   "seed": self.seed}
        options.update({k: kwargs[k] for k in list(kwargs) if k in _SAMPLING_KEYS})
        options["stop"] = [*(self.stop or []), *(stop or []), *(kwargs.get("stop_sequences") or [])]
        return options

    def format_documents(self, docs: list[Any]) -> str:
        """Use in a chain as `retriever | llm.format_documents`: canonical order, and the documents are
        remembered so their KV is cached and found at document granularity when the prompt comes."""
        self.document_memory.remember(docs)
        return format_documents(docs)


_SAMPLING_KEYS = {"temperature", "max_tokens", "top_p", "top_k", "min_p", "seed", "repetition_penalty",
                  "presence_penalty", "frequency_penalty", "json_schema", "ignore_eos", "min_tokens", "logprobs"}
