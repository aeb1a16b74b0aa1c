"""LlamaIndex integration: `from llama_index.llms.inferplug import InferPlug`."""

from llama_index.llms.inferplug.base import InferPlug
from llama_index.llms.inferplug.postprocessor import DocumentCacheHints

__all__ = ["DocumentCacheHints", "InferPlug"]
