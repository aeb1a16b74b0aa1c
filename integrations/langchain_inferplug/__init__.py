"""LangChain integration: `from langchain_inferplug import ChatInferPlug, InferPlugLLM`."""

from langchain_inferplug.chat_models import ChatInferPlug
from langchain_inferplug.llms import InferPlugLLM

__all__ = ["ChatInferPlug", "InferPlugLLM"]
