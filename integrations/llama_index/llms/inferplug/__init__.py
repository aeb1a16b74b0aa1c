"""LlamaIndex integration: `from llama_index.llms.inferplug import InferPlug`."""

from llama_index.llms.inferplug.base import InferPlug
from llama_index.llms.inferplug.postprocessor import DocumentCacheHints
from llama_index.llms.inferplug.precompute import DocumentKVPrecompute

__all__ = ["DocumentCacheHints", "DocumentKVPrecompute", "InferPlug"]
