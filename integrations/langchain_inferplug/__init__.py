"""LangChain integration: `from langchain_inferplug import ChatInferPlug, InferPlugLLM`."""

from langchain_inferplug.chat_models import ChatInferPlug
from langchain_inferplug.llms import InferPlugLLM
from langchain_inferplug.precompute import DocumentKVPrecompute

__all__ = ["ChatInferPlug", "DocumentKVPrecompute", "InferPlugLLM"]
