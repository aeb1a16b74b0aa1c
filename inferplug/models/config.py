"""The architecture facts our engine needs, read from config.json or GGUF metadata."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ModelConfig:
    """A decoder of one of the families in models/registry.py. Names follow HF's config.json; the fields after
    eos_token_ids are the families' differences, left at Llama's where a family has none."""

    architecture: str  # HF's model_type: "llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "gemma3_text"
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
    family: str = "llama"  # models/registry.py's name for what decodes it
    layer_windows: tuple[int, ...] | None = None  # per layer: a sliding window's size, 0 for full attention
    rope_local_theta: float | None = None  # the RoPE base of sliding-window layers (Gemma 3), unscaled
    attention_scale: float | None = None  # None: head_dim ** -0.5
    final_logit_softcap: float | None = None  # logits = cap * tanh(logits / cap)
    num_experts: int = 0  # a mixture-of-experts MLP where moe_layers says so (models/moe.py)
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False  # the top-k router weights renormalized to sum to 1
    moe_layers: tuple[bool, ...] = ()

    def is_moe_layer(self, layer: int) -> bool:
        return self.num_experts > 0 and bool(self.moe_layers) and self.moe_layers[layer]

    def window(self, layer: int) -> int:
        """Layer `layer`'s sliding window (0: it attends to the whole context)."""
        return self.layer_windows[layer] if self.layer_windows else 0

    def num_parameters(self) -> int:
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        q = self.num_attention_heads * self.head_dim
        kv = self.num_key_value_heads * self.head_dim
        attn = h * q + 2 * h * kv + q * h + (q + 2 * kv if self.attention_bias else 0)
        moe = self.num_experts * (3 * h * self.moe_intermediate_size + h)  # experts and the router
        mlps = sum(moe if self.is_moe_layer(n) else 3 * h * i for n in range(self.num_hidden_layers))
        head = 0 if self.tie_word_embeddings else v * h
        return v * h + self.num_hidden_layers * (attn + 2 * h) + mlps + h + head

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

    def layer_matrices(self, layer: int) -> dict[str, tuple[int, int]]:
        """Layer `layer`'s matrices as (out, in), by HF name after "model.layers.N.": linear_shapes', or in an MoE
        layer the router and each expert's projections in place of the dense MLP."""
        shapes = self.linear_shapes()
        if not self.is_moe_layer(layer):
            return shapes
        h, inter = self.hidden_size, self.moe_intermediate_size
        attention = {name: shape for name, shape in shapes.items() if not name.startswith("mlp.")}
        experts = {f"mlp.experts.{e}.{proj}": shape for e in range(self.num_experts)
                   for proj, shape in (("gate_proj", (inter, h)), ("up_proj", (inter, h)), ("down_proj", (h, inter)))}
        return {**attention, "mlp.gate": (self.num_experts, h), **experts}

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * dtype_bytes
