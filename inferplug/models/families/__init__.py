"""One module per model family, each a `FAMILY` (models/family.py) that says how it differs from Llama's decoder."""
