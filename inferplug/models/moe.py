"""A mixture-of-experts MLP (Qwen3-MoE): a router picks top-k experts a row, each a gated MLP of its own.

The experts run grouped: each expert the step selected is read once, for all the rows that chose it (vLLM's
fused_moe and llama.cpp's mul_mat_id group the same way). Where the ops run an MoE layer's block experts in one call
(the CPU kernels: kernels/cpu/moe_experts.cpp) that is the whole layer after the router; where they offer a grouped
GEMM (Triton on CUDA: kernels/moe_gemm.py) every expert runs in one launch a projection, a row's output summing its
k experts in the router's order; otherwise one matmul pair per selected expert, a row's output summing its experts
in ascending expert order (the CPU call's order too, so both give the same bits). Either way a row's output does
not depend on its batch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from inferplug.quant.block_linear import BlockLinear
from inferplug.quant.checkpoint_layers import fuse_rows
from inferplug.quant.linear import linear


@dataclass
class MoeWeights:
    router: torch.Tensor  # [experts, hidden]
    gate_up: list[Any]  # per expert: gate and up rows fused, a tensor or the layer that runs its blocks
    down: list[Any]
    router_bias: torch.Tensor | None = None  # gpt-oss's router and experts carry biases: [experts]
    gate_up_bias: torch.Tensor | None = None  # [experts, 2 * inter]
    down_bias: torch.Tensor | None = None  # [experts, hidden]
    router_scale: torch.Tensor | None = None  # Gemma 4: the router's input times this [hidden] and 1 / sqrt(hidden)
    expert_scale: torch.Tensor | None = None  # Gemma 4: each expert's output weight times this [experts]
    _stacked: tuple[Any, Any] | None = field(default=None, repr=False)
    _blocks: tuple | None = field(default=None, repr=False)

    def stacked(self) -> tuple[Any, Any] | None:
        """The experts as a grouped GEMM's operands, made once: float ones as [experts, 2 * inter, hidden] and
        [experts, hidden, inter]; MXFP4 ones (gpt-oss's) as their blocks so stacked (kernels/moe_gemm_ref.MXFP4Experts).
        Each expert's entry (or its layer's blocks) becomes a view of them, so nothing is held twice. None for other
        block weights."""
        if self._stacked is None and all(isinstance(w, torch.Tensor) for w in (*self.gate_up, *self.down)):
            self._stacked = torch.stack(self.gate_up), torch.stack(self.down)
            self.gate_up[:], self.down[:] = self._stacked[0].unbind(0), self._stacked[1].unbind(0)
        if self._stacked is None and _same_mxfp4_layers(self.gate_up) and _same_mxfp4_layers(self.down):
            self._stacked = tuple(_stacked_blocks(layers) for layers in (self.gate_up, self.down))
        return self._stacked

    def blocks(self) -> tuple[torch.Tensor, torch.Tensor, int, str, str] | None:
        """The block experts as the CPU kernels' MoE call takes them, made once: each expert's gate/up and down blocks
        as int64 tables of their addresses (one operand a projection: a list of 128 tensors costs an op ~0.1 ms, and
        a stacked copy would cost a load the experts' bytes twice), gate/up's rows, and the two formats (the block
        layers' kernel prefixes). The layers stay in this object, so the addresses stay valid. None unless each
        projection is one block format, contiguous and without bias."""
        if self._blocks is None:
            self._blocks = _expert_table(self.gate_up, self.down) or ()
        return self._blocks or None

    def map(self, convert: Callable[[Any], Any]) -> None:
        """Every expert's weights replaced by convert(weight) (quantize_model's layers)."""
        self.gate_up[:], self.down[:] = map(convert, self.gate_up), map(convert, self.down)
        self._stacked = self._blocks = None

    @classmethod
    def take(cls, take: Callable[[str], Any], take_gate_up: Callable[[str], Any], prefix: str, experts: int,
             biased: bool = False, scaled: bool = False) -> "MoeWeights":
        """The router and experts under `prefix` (e.g. "model.layers.3.mlp."), HF's per-expert names, each expert's
        gate and up rows by `take_gate_up` (gate_up_taker's); `biased`: with the router's and experts' biases;
        `scaled`: with the router's input scale and each expert's."""
        def pair(e: int, kind: str) -> list[Any]:
            return [take(f"{prefix}experts.{e}.{proj}.{kind}") for proj in ("gate_proj", "up_proj")]

        gate_up = [take_gate_up(f"{prefix}experts.{e}.") for e in range(experts)]
        down = [take(f"{prefix}experts.{e}.down_proj.weight") for e in range(experts)]
        if scaled:
            return cls(take(f"{prefix}gate.weight"), gate_up, down, router_scale=take(f"{prefix}gate.scale"),
                       expert_scale=torch.stack([take(f"{prefix}experts.{e}.down_proj.scale").reshape(())
                                                 for e in range(experts)]))
        if not biased:
            return cls(take(f"{prefix}gate.weight"), gate_up, down)
        return cls(take(f"{prefix}gate.weight"), gate_up, down, take(f"{prefix}gate.bias"),
                   torch.stack([torch.cat(pair(e, "bias")) for e in range(experts)]),
                   torch.stack([take(f"{prefix}experts.{e}.down_proj.bias") for e in range(experts)]))


def gate_up_taker(take: Callable[[str], Any], has: Callable[[str], bool]) -> Callable[[str], Any]:
    """take_gate_up(prefix): a gated MLP's gate then up rows under `prefix` as one weight. The loader's fused
    `gate_up_proj` where it made one (a GGUF's block layers, fused at conversion, so that a warm load maps them from
    the conversion cache instead of copying them: 5.2 GB of a 24-layer Qwen3-30B-A3B's experts), else gate_proj's and
    up_proj's fused now."""
    def take_gate_up(prefix: str) -> Any:
        fused = f"{prefix}gate_up_proj.weight"
        if has(fused):
            return take(fused)
        return fuse_rows([take(f"{prefix}gate_proj.weight"), take(f"{prefix}up_proj.weight")])
    return take_gate_up


def _same_mxfp4_layers(layers: list[Any]) -> bool:
    from inferplug.quant.block_linear import MXFP4Linear

    return all(type(w) is MXFP4Linear and w.bias is None for w in layers) and len({w.blocks.shape for w in layers}) == 1


def _stacked_blocks(layers: list[Any]):
    """MXFP4 layers' blocks as one [experts, rows, row bytes] tensor, each layer's blocks now a view of it."""
    from inferplug.kernels.moe_gemm_ref import MXFP4Experts

    blocks = torch.stack([w.blocks for w in layers])
    for w, view in zip(layers, blocks.unbind(0)):
        w.blocks = view
    return MXFP4Experts(blocks, layers[0].in_features)


def _expert_table(gate_up: list[Any], down: list[Any]) -> tuple[torch.Tensor, torch.Tensor, int, str, str] | None:
    kinds = [{type(w) for w in ws} for ws in (gate_up, down)]
    if any(len(k) != 1 or not issubclass(next(iter(k)), BlockLinear) for k in kinds):
        return None
    if any(w.bias is not None or not w.blocks.is_contiguous() for w in (*gate_up, *down)) or \
            len({w.blocks.shape for w in gate_up}) != 1 or len({w.blocks.shape for w in down}) != 1 or \
            gate_up[0].out_features != 2 * down[0].in_features or gate_up[0].in_features != down[0].out_features:
        return None
    tables = [torch.tensor([w.blocks.data_ptr() for w in ws], dtype=torch.long) for ws in (gate_up, down)]
    return (*tables, gate_up[0].out_features, *(type(ws[0]).kernel.removesuffix("_matmul") for ws in (gate_up, down)))


def router_logits(h: torch.Tensor, moe: MoeWeights, ops) -> torch.Tensor:
    """h @ router.T (+ the router's bias, gpt-oss's), each row's logits independent of the step's other rows
    (`ops.router_logits`)."""
    if moe.router_scale is not None:
        h = h * moe.router_scale * moe.router_scale.shape[0] ** -0.5
    logits = ops.router_logits(h, moe.router)
    return logits if moe.router_bias is None else logits + moe.router_bias


def moe_mlp(h: torch.Tensor, moe: MoeWeights, top_k: int, renormalize: bool,
            activation: Callable[[torch.Tensor], torch.Tensor], decode_rows: int | None, ops,
            router_input: torch.Tensor | None = None) -> torch.Tensor:
    """The MoE MLP of rows `h` ([T, hidden]). `decode_rows`: the leading rows that take decode arithmetic in
    block layers (quant/block_linear.py); None: all of them. `ops`: the model's ops (ops/), whose MoE call or
    grouped GEMM runs the experts where it can. `router_input`: what the router reads where it is not `h`
    (Gemma 4's)."""
    probs = torch.softmax(router_logits(h if router_input is None else router_input, moe, ops).float(), dim=-1)
    weights, chosen = probs.topk(top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    if moe.expert_scale is not None:
        weights = weights * moe.expert_scale[chosen]
    weights = weights.to(h.dtype)
    out = ops.moe_experts(h, chosen, weights, moe, decode_rows, activation)
    if out is not None:
        return out
    biased = moe.down_bias is not None
    stacked = moe.stacked() if ops.grouped_matmul is not None else None
    if stacked is not None:
        return _grouped(h, stacked, moe, chosen, weights, activation, ops.grouped_matmul)
    out = torch.zeros_like(h)
    for expert in chosen.unique().tolist():  # ascending: each row's sum in one order
        rows, slot = (chosen == expert).nonzero(as_tuple=True)
        decode = None if decode_rows is None else int((rows < decode_rows).sum())
        gate_up_bias, down_bias = (moe.gate_up_bias[expert], moe.down_bias[expert]) if biased else (None, None)
        hidden = activation(linear(h[rows], moe.gate_up[expert], gate_up_bias, decode))
        y = linear(hidden, moe.down[expert], down_bias, decode)
        out.index_add_(0, rows, y * weights[rows, slot, None])
    return out


def _grouped(h: torch.Tensor, stacked: tuple[Any, Any], moe: MoeWeights, chosen: torch.Tensor, weights: torch.Tensor,
             activation: Callable[[torch.Tensor], torch.Tensor], grouped_matmul: Callable[..., torch.Tensor]):
    """Every selected expert in one grouped GEMM a projection, with its bias where it has one: the (row, choice)
    pairs laid out expert by expert (kernels/moe_gemm_ref.expert_tiles), gate/up from the rows in place, down from
    those slots, then each row's k outputs summed in the router's order (no atomics: the same bits in any batch)."""
    from inferplug.kernels.moe_gemm import BLOCK_M
    from inferplug.kernels.moe_gemm_ref import expert_tiles

    gate_up, down = stacked
    tokens, top_k = chosen.shape
    pairs, tiles = expert_tiles(chosen, len(moe.down), BLOCK_M)
    valid = pairs >= 0
    rows = torch.where(valid, pairs // top_k, -1)
    hidden = activation(grouped_matmul(h, gate_up, rows, tiles, moe.gate_up_bias))  # padding slots: never read
    slots = torch.where(valid, torch.arange(len(pairs), device=h.device), -1)
    out = grouped_matmul(hidden.contiguous(), down, slots, tiles, moe.down_bias)
    by_pair = torch.empty(tokens * top_k, out.shape[1], dtype=out.dtype, device=out.device)
    by_pair[pairs[valid]] = out[valid]
    return (by_pair.view(tokens, top_k, -1) * weights[..., None]).sum(dim=1)
