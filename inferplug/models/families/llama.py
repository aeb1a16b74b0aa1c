"""Llama 2/3, Mistral, Qwen2 and SmolLM: the decoder with no switch set (Qwen2's q/k/v biases are in its weights)."""

from inferplug.models.family import Family

FAMILY = Family(
    name="llama",
    hf_model_types=("llama", "mistral", "qwen2"),
    gguf_architectures=("llama", "mistral", "qwen2"),
    gguf_interleaved_rope=True,  # llama's and mistral's files; qwen2's converter leaves the rows (registry.py)
    fused_decode=True,
)
