"""Model definitions (llama.py) and checkpoint loading (loader.py)."""
