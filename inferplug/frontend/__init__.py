"""What the LangChain and LlamaIndex front ends share: requests with RAG hints, tool calls, event streams."""
