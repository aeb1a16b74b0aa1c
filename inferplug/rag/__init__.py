"""RAG-aware prompt layout and document cache keys."""
