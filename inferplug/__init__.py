"""inferplug: fast local LLM inference as a one-line choice in LangChain and LlamaIndex apps."""

__version__ = "0.1.0"
