"""The architecture facts our engine needs, read from config.json or GGUF metadata."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ModelConfig:
    """A Llama-family decoder (Llama 2/3, Mistral, Qwen2, SmolLM). Names follow HF's config.json."""

    architecture: str  # "llama", "mistral", "qwen2"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # HF's rope_scaling / rope_parameters (llama3, linear, ...)
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2 has biases on q/k/v
    sliding_window: int | None = None
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)

    def num_parameters(self) -> int:
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        q = self.num_attention_heads * self.head_dim
        kv = self.num_key_value_heads * self.head_dim
        attn = h * q + 2 * h * kv + q * h + (q + 2 * kv if self.attention_bias else 0)
        per_layer = attn + 3 * h * i + 2 * h
        head = 0 if self.tie_word_embeddings else v * h
        return v * h + self.num_hidden_layers * per_layer + h + head

    @staticmethod
    def shared_input(module: str) -> str:
        """The projection whose input `module` reads too (q/k/v read one, gate/up one): what GPTQ's act-order
        permutes alike."""
        return {"self_attn.k_proj": "self_attn.q_proj", "self_attn.v_proj": "self_attn.q_proj",
                "mlp.up_proj": "mlp.gate_proj"}.get(module, module)

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """Each decoder layer's linears as (out, in), by HF module name."""
        h, q, kv = self.hidden_size, self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        return {"self_attn.q_proj": (q, h), "self_attn.k_proj": (kv, h), "self_attn.v_proj": (kv, h),
                "self_attn.o_proj": (h, q), "mlp.gate_proj": (self.intermediate_size, h),
                "mlp.up_proj": (self.intermediate_size, h), "mlp.down_proj": (h, self.intermediate_size)}

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * dtype_bytes
