"""Weight-only quantized linear layers and quantized-format unpacking."""
