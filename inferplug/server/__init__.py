"""The OpenAI-compatible HTTP server (`inferplug serve`)."""
