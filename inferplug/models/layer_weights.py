"""A decoder layer's weights as the model holds them (models/decoder.py builds them, one per layer): its norms, its
linears (float tensors or weight-only layers, quant/), and the parts a family adds (experts, a DeltaNet, Gemma 4's
per-layer geometry)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from inferplug.models.delta_net import DeltaNetWeights
from inferplug.models.moe import MoeWeights

# a layer's linear weights (an MoE layer's MLP is in `moe`)
LINEARS = ("qkv", "o", "gate_up", "down", "per_layer_embed", "per_layer_gate", "per_layer_proj", "shared_gate_up",
           "shared_down")


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    qkv: Any  # None in a DeltaNet layer (its weights are in `delta`); q, k, v, then the output gate's rows if any
    qkv_bias: torch.Tensor | None
    o: Any
    post_norm: torch.Tensor  # the MLP's input norm
    gate_up: Any  # None in an MoE layer
    down: Any
    q_norm: torch.Tensor | None = None  # QK-norm: per head, before RoPE
    k_norm: torch.Tensor | None = None
    attn_out_norm: torch.Tensor | None = None  # sandwich norms: on the attention and MLP outputs
    mlp_out_norm: torch.Tensor | None = None
    moe: MoeWeights | None = None
    window: int = 0  # the sliding window it attends in (0: the whole context)
    o_bias: torch.Tensor | None = None
    sinks: torch.Tensor | None = None  # attention sinks: a logit per head (fp32), in each query's softmax
    # Gemma 4: this layer's geometry, the layer whose KV it attends over (itself unless shared), V from K's
    # projection, its per-layer input (its rows of the embedding's projection; its gate, projection and norm), and
    # the scale on its output
    kv_heads: int = 0
    head_dim: int = 0
    kv_source: int = 0
    v_from_k: bool = False
    per_layer_embed: Any = None
    per_layer_gate: Any = None
    per_layer_proj: Any = None
    per_layer_norm: torch.Tensor | None = None
    scalar: float | None = None
    # Gemma 4's MoE layers: the dense MLP and the experts side by side, each between its own norms
    experts_in_norm: torch.Tensor | None = None
    dense_out_norm: torch.Tensor | None = None
    experts_out_norm: torch.Tensor | None = None
    delta: DeltaNetWeights | None = None  # Qwen3.5: a Gated DeltaNet in place of attention (models/delta_net.py)
    gate_rows: int = 0  # Qwen3.5's attention: qkv's last rows gate its output (sigmoid)
    # Qwen3.5-MoE: a shared expert every row runs beside the routed ones, scaled by sigmoid(shared_gate . x)
    shared_gate_up: Any = None
    shared_down: Any = None
    shared_gate: Any = None

    def linears(self) -> Iterator[Any]:
        """Every linear weight of the layer, its experts' too."""
        yield from (getattr(self, name) for name in LINEARS if getattr(self, name) is not None)
        if self.moe is not None:
            yield from self.moe.gate_up
            yield from self.moe.down
        if self.delta is not None:
            yield from (getattr(self.delta, name) for name in DeltaNetWeights.LINEARS)

    def map_linears(self, convert: Callable[[Any], Any]) -> None:
        for name in LINEARS:
            if getattr(self, name) is not None:
                setattr(self, name, convert(getattr(self, name)))
        if self.moe is not None:
            self.moe.map(convert)
        if self.delta is not None:
            for name in DeltaNetWeights.LINEARS:
                setattr(self.delta, name, convert(getattr(self.delta, name)))


def row_slice(weight: Any, rows: slice | torch.Tensor) -> Any:
    """Some rows of a weight (a slice, or their indices): a float tensor's, or a GGUF block layer's
    (quant/block_linear.py)."""
    if isinstance(weight, torch.Tensor):
        return weight[rows].contiguous()
    return type(weight)(weight.blocks[rows].contiguous())
