"""The architecture facts our engine needs, read from config.json or GGUF metadata."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


# A hybrid model's prefix cache keeps this many snapshots of a sequence's DeltaNet state (engine/state_snapshots.py):
# a chat's turns, a shared system prompt; each one sequence's state (state_bytes_per_sequence)
STATE_SNAPSHOTS = 8


def window_pool_blocks(window: int, block_size: int, max_num_seqs: int, max_step_tokens: int, num_blocks: int) -> int:
    """The blocks a model's sliding-window layers keep in their own pools (engine/window_blocks.py): each running
    sequence's window and one token more (a beam's rewind) straddling one more block, a partial block each, the
    step's new tokens, and the null block; never more than the other pools' blocks (num_blocks) and the null one, as
    a sequence holds no more blocks in this group than in the other. Capped so, the group can run short where the two
    groups' prefix caches keep different blocks (the window group evicts sooner): a sequence is then preempted, as
    when the other pools run short. As llama.cpp sizes its SWA cache: a window per parallel sequence and a batch.
    The engine allocates and the memory plan counts exactly these."""
    per_seq = -(-(window + 1) // block_size) + 2
    return 1 + min(max_num_seqs * per_seq + -(-max_step_tokens // block_size), num_blocks)


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
    # Gemma 4's per-layer geometry: each layer's head size and KV heads where they differ from the model's (its full
    # layers are wider), the layer whose KV each attends over (its own, or an earlier one's: shared KV), the layers
    # whose V is their K projection (attention_k_eq_v), and its per-layer input embeddings' width (0: none)
    layer_head_dims: tuple[int, ...] = ()
    layer_kv_heads: tuple[int, ...] = ()
    kv_sources: tuple[int, ...] = ()
    v_from_k: tuple[bool, ...] = ()
    per_layer_input_size: int = 0
    layer_intermediate_sizes: tuple[int, ...] = ()  # the dense MLP's width per layer where it differs (E2B's doubles)
    dense_beside_moe: bool = False  # Gemma 4's MoE layers run a dense MLP beside the experts
    # Qwen3.5's hybrid stack: the Gated DeltaNet layers (models/delta_net.py; the rest attend), their geometry, and
    # the sigmoid gate on the attention layers' output (q_proj's second half of each head)
    linear_layers: tuple[bool, ...] = ()
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    linear_heads_tiled: bool = False  # value head j reads q/k head j % key heads (llama.cpp's order), not j // ratio
    attention_output_gate: bool = False
    shared_expert_intermediate_size: int = 0  # Qwen3.5-MoE: a shared expert beside the routed ones (0: none)

    def head_dim_of(self, layer: int) -> int:
        return self.layer_head_dims[layer] if self.layer_head_dims else self.head_dim

    def kv_heads_of(self, layer: int) -> int:
        return self.layer_kv_heads[layer] if self.layer_kv_heads else self.num_key_value_heads

    def kv_source(self, layer: int) -> int:
        """The layer whose KV `layer` attends over: itself, unless it reads an earlier layer's (shared KV)."""
        return self.kv_sources[layer] if self.kv_sources else layer

    def rope_table_dims(self) -> tuple[int, ...]:
        """The head sizes of the decoder's RoPE tables: its full layers', and its window layers' where those have a
        base of their own (Gemma 3 and 4)."""
        def first(window: bool) -> int:
            return next((self.head_dim_of(i) for i in range(self.num_hidden_layers) if bool(self.window(i)) == window),
                        self.head_dim)

        return (first(False),) if self.rope_local_theta is None else (first(False), first(True))

    def is_linear_layer(self, layer: int) -> bool:
        """Whether layer `layer` is a Gated DeltaNet (a recurrent state per sequence, no KV)."""
        return bool(self.linear_layers) and self.linear_layers[layer]

    def delta_net_sizes(self) -> tuple[int, int, int]:
        """A DeltaNet layer's q/k width, v width and conv channels (q, k and v pass the conv)."""
        key = self.linear_num_key_heads * self.linear_key_head_dim
        value = self.linear_num_value_heads * self.linear_value_head_dim
        return key, value, 2 * key + value

    def state_bytes_per_sequence(self, dtype_bytes: int) -> int:
        """The fixed memory one sequence holds in the DeltaNet layers: its conv window (`dtype_bytes` a value) and
        its fp32 recurrent state, [value heads, key dim, value dim], per layer."""
        if not self.linear_layers:
            return 0
        conv = self.delta_net_sizes()[2] * (self.linear_conv_kernel_dim - 1) * dtype_bytes
        recurrent = self.linear_num_value_heads * self.linear_key_head_dim * self.linear_value_head_dim * 4
        return sum(self.linear_layers) * (conv + recurrent)

    def is_moe_layer(self, layer: int) -> bool:
        return self.num_experts > 0 and bool(self.moe_layers) and self.moe_layers[layer]

    def window(self, layer: int) -> int:
        """Layer `layer`'s sliding window (0: it attends to the whole context)."""
        return self.layer_windows[layer] if self.layer_windows else 0

    def num_parameters(self) -> int:
        h, v, ple = self.hidden_size, self.vocab_size, self.per_layer_input_size
        layers = sum(math.prod(shape) for n in range(self.num_hidden_layers) for shape in self.layer_matrices(n).values())
        biases = sum(self.num_attention_heads * self.head_dim_of(n) + 2 * self.kv_heads_of(n) * self.head_dim_of(n)
                     for n in range(self.num_hidden_layers)) if self.attention_bias else 0
        per_layer_inputs = (v + h) * self.num_hidden_layers * ple  # their embedding and their projection
        head = 0 if self.tie_word_embeddings else v * h
        return v * h + layers + biases + self.num_hidden_layers * 2 * h + per_layer_inputs + h + head

    def expert_parameters(self) -> int:
        """The routed experts' weights, over all layers (an MoE's bulk; MXFP4 in gpt-oss's release)."""
        return sum(math.prod(shape) for n in range(self.num_hidden_layers)
                   for name, shape in self.layer_matrices(n).items() if name.startswith("mlp.experts."))

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
        """Layer `layer`'s matrices as (out, in), by HF name after "model.layers.N.": linear_shapes' at its own
        geometry (no K and V where it reads another layer's KV, no V where V is K), its per-layer input's two, or in
        an MoE layer the router and each expert's projections in place of the dense MLP."""
        h, q, kv = self.hidden_size, self.num_attention_heads * self.head_dim_of(layer), \
            self.kv_heads_of(layer) * self.head_dim_of(layer)
        inter = self.layer_intermediate_sizes[layer] if self.layer_intermediate_sizes else self.intermediate_size
        shapes = {**self.linear_shapes(), "self_attn.q_proj": (q, h), "self_attn.k_proj": (kv, h),
                  "self_attn.v_proj": (kv, h), "self_attn.o_proj": (h, q), "mlp.gate_proj": (inter, h),
                  "mlp.up_proj": (inter, h), "mlp.down_proj": (h, inter)}
        if self.is_linear_layer(layer):  # a DeltaNet in place of attention
            key, value, conv = self.delta_net_sizes()
            heads = self.linear_num_value_heads
            shapes = {name: shape for name, shape in shapes.items() if not name.startswith("self_attn.")}
            shapes.update({"linear_attn.in_proj_qkv": (conv, h), "linear_attn.in_proj_z": (value, h),
                           "linear_attn.in_proj_b": (heads, h), "linear_attn.in_proj_a": (heads, h),
                           "linear_attn.out_proj": (h, value)})
        elif self.attention_output_gate:  # q_proj carries the gate
            shapes["self_attn.q_proj"] = (2 * q, h)
        if self.kv_source(layer) != layer:
            del shapes["self_attn.k_proj"], shapes["self_attn.v_proj"]
        elif self.v_from_k and self.v_from_k[layer]:
            del shapes["self_attn.v_proj"]
        if self.per_layer_input_size:
            shapes.update({"per_layer_input_gate": (self.per_layer_input_size, h),
                           "per_layer_projection": (h, self.per_layer_input_size)})
        if not self.is_moe_layer(layer):
            return shapes
        h, inter = self.hidden_size, self.moe_intermediate_size
        attention = {name: shape for name, shape in shapes.items() if not name.startswith("mlp.")}
        experts = {f"mlp.experts.{e}.{proj}": shape for e in range(self.num_experts)
                   for proj, shape in (("gate_proj", (inter, h)), ("up_proj", (inter, h)), ("down_proj", (h, inter)))}
        shared = self.shared_expert_intermediate_size
        if shared:  # every row runs it, gated by one logit
            experts.update({"mlp.shared_expert.gate_proj": (shared, h), "mlp.shared_expert.up_proj": (shared, h),
                            "mlp.shared_expert.down_proj": (h, shared), "mlp.shared_expert_gate": (1, h)})
        return {**(shapes if self.dense_beside_moe else attention), "mlp.gate": (self.num_experts, h), **experts}

    def kv_window(self) -> int:
        """The widest sliding window of the layers that keep their own KV (0: none attends in a window)."""
        return max((self.window(n) for n in range(self.num_hidden_layers)
                    if self.kv_source(n) == n and not self.is_linear_layer(n)), default=0)

    def window_kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """kv_bytes_per_token's share of the sliding-window layers."""
        return sum(2 * self.kv_heads_of(n) * self.head_dim_of(n) * dtype_bytes for n in range(self.num_hidden_layers)
                   if self.kv_source(n) == n and not self.is_linear_layer(n) and self.window(n))

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V of every layer that keeps its own (a layer reading another's KV adds none)."""
        return sum(2 * self.kv_heads_of(n) * self.head_dim_of(n) * dtype_bytes
                   for n in range(self.num_hidden_layers) if self.kv_source(n) == n and not self.is_linear_layer(n))
