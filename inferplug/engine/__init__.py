"""Our paged, continuously batching inference engine (the `native` backend)."""
