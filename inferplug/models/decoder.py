"""The decoder every family runs (models/registry.py), over paged KV pools: Llama's, with each family's
differences (models/family.py) switched on where the family has them.

Weights arrive as a HF state dict (HF parameter names and values); q/k/v and gate/up are fused at load so a layer
runs three big matmuls instead of five small ones. `forward` takes the flat tokens of one engine step and an
AttentionContext; `compute_logits` runs the head only on rows that sample.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from inferplug.models.config import ModelConfig
from inferplug.models.delta_net import DeltaNetWeights, allocate_states, delta_net
from inferplug.models import huge_pages
from inferplug.models.heap import HeapBound
from inferplug.models.layer_weights import LINEARS, LayerWeights, row_slice
from inferplug.models.moe import MoeWeights, gate_up_taker, moe_mlp
from inferplug.models.registry import family
from inferplug.models.rope import partial_rope_order, rope_tables
from inferplug.ops import select_ops
from inferplug.ops.attention import AttentionContext
from inferplug.ops.parallel_group import SINGLE, SingleDevice
from inferplug.ops.row_math import row_gate
from inferplug.quant.checkpoint_layers import fold_down_order, fuse_rows  # torch.cat, or an AWQ / GPTQ checkpoint's layers
from inferplug.quant.linear import convert_head, layer_converter, linear  # linear: F.linear, or a layer's kernel

class DecoderModel:
    def __init__(self, config: ModelConfig, state_dict: dict[str, torch.Tensor], *, dtype: torch.dtype, device: str = "cpu",
                 attention: str = "auto", kv_dtype: torch.dtype | None = None, parallel: SingleDevice = SINGLE,
                 max_positions: int = 0, weight_format: str | None = None):
        """`max_positions`: the positions the RoPE tables hold (the engine's max_model_len; 0: the model's
        max_position_embeddings). `parallel`: this rank's group under tensor parallelism (engine/parallel): `config`
        and `state_dict` are then the rank's share of the heads and its slices of the weights. The model consumes `state_dict` (each entry
        is popped as it is taken), so a fused projection's parts are freed as it is made: at 7B, holding them to the
        end doubles every q/k/v and gate/up, 2.8 GB. `weight_format`: each layer's float linears become that format's
        layers as the layer is built (quant/linear.py layer_converter), so a float checkpoint is never whole in the
        compute dtype: a bf16 7B one would be 27 GB in fp32 (quantize_model still makes the head)."""
        self.config = config
        self.family = fam = family(config.family)
        self.parallel = parallel
        self.dtype, self.device = dtype, torch.device(device)
        self.kv_dtype = kv_dtype or dtype  # the pools' dtype (the plan's kv_dtype)
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.scale = config.attention_scale or self.head_dim**-0.5

        heap = HeapBound()

        def take(name: str) -> Any:
            if name not in state_dict:
                raise KeyError(f"weight {name!r} is missing from the checkpoint")
            heap.check(0)  # the parts of what was fused so far are freed: their pages go back, not into the RSS
            weight = state_dict.pop(name)
            if not isinstance(weight, torch.Tensor):  # a layer: AWQ / GPTQ ones load on their device, MXFP4 ones on the CPU
                return weight.to(self.device)
            return weight.to(device=self.device, dtype=dtype).contiguous()

        def norm(name: str) -> torch.Tensor:  # the multiplier the norm applies (Gemma's HF weights are w, for 1 + w)
            weight = take(name)
            # Gemma's 1 + w stays fp32: HF scales the fp32 norm by it and rounds once (ops' add_rms_norm)
            return weight.float() + 1 if fam.norms_plus_one else weight

        def maybe_norm(name: str) -> torch.Tensor | None:
            return norm(name) if name in state_dict else None

        take_gate_up = gate_up_taker(take, state_dict.__contains__)
        self.embed = take("model.embed_tokens.weight")
        # Gemma scales the embedding by sqrt(hidden), rounded to the model's dtype as HF does
        self.embed_scale = torch.tensor(config.hidden_size**0.5, dtype=dtype).item() if fam.scaled_embedding else None
        self.norm = norm("model.norm.weight")
        if config.tie_word_embeddings or "lm_head.weight" not in state_dict:
            self.lm_head = self.embed  # its own copy in the head's format comes from quantize_model
        else:
            self.lm_head = take("lm_head.weight")
            if weight_format:  # made now, not held in fp32 while the layers are
                self.lm_head = convert_head(self.lm_head, weight_format)
        self.per_layer_inputs = None  # Gemma 4: (their embedding table, the norm of the embedding's projection)
        width = config.per_layer_input_size
        if width:
            self.per_layer_inputs = (take("model.embed_tokens_per_layer.weight"),
                                     take("model.per_layer_projection_norm.weight"))
            projection = take("model.per_layer_model_projection.weight")  # each layer takes its rows
        scaling = config.rope_scaling or {}
        # partial RoPE (Qwen3.5): each head's rotated dims moved to the pairs the tables rotate (rope.py)
        order = partial_rope_order(config.head_dim, scaling["partial_rotary_factor"]) \
            if scaling.get("rope_type") == "partial" else None
        self.layers = []
        convert = layer_converter(weight_format, self.device.type) if weight_format else None
        for i in range(config.num_hidden_layers):
            p = f"model.layers.{i}."
            # what this layer projects: q, and k and v unless it reads another layer's KV; v unless V is K
            own_kv, v_from_k = config.kv_source(i) == i, bool(config.v_from_k and config.v_from_k[i])
            parts = "qkv"[: 1 if not own_kv else 2 if v_from_k else 3]
            for unused in ("k_proj.weight", "v_proj.weight", "k_norm.weight") if not own_kv else ():
                state_dict.pop(f"{p}self_attn.{unused}", None)  # shipped for shared layers by some checkpoints
            delta = attn = bias = q_norm = k_norm = None
            if config.is_linear_layer(i):
                delta = DeltaNetWeights.take(take, f"{p}linear_attn.", config, self.device)
            else:
                attn = [take(f"{p}self_attn.{n}_proj.weight") for n in parts]
                q_norm, k_norm = maybe_norm(f"{p}self_attn.q_norm.weight"), maybe_norm(f"{p}self_attn.k_norm.weight")
            if config.attention_output_gate and attn:  # q_proj's heads: q rows then gate rows; the gate goes last
                heads = torch.arange(2 * self.q_size).view(self.num_heads, 2, -1)
                attn = [row_slice(attn[0], heads[:, 0].flatten()), *attn[1:], row_slice(attn[0], heads[:, 1].flatten())]
            if order is not None and attn:
                attn[0] = row_slice(attn[0], (torch.arange(self.q_size).view(self.num_heads, -1)[:, order]).flatten())
                attn[1] = row_slice(attn[1], (torch.arange(self.kv_size).view(self.num_kv_heads, -1)[:, order]).flatten())
                q_norm, k_norm = q_norm[order], k_norm[order]
            if f"{p}self_attn.q_proj.bias" in state_dict:
                bias = torch.cat([take(f"{p}self_attn.{n}_proj.bias") for n in parts])
            gate_up = down = moe = None
            if config.is_moe_layer(i):
                moe = MoeWeights.take(take, take_gate_up, f"{p}mlp.", config.num_experts, biased=fam.all_biases,
                                      scaled=config.dense_beside_moe)
            if moe is None or config.dense_beside_moe:
                gate_up = take_gate_up(f"{p}mlp.")
                gate_up, down = fold_down_order(gate_up, take(f"{p}mlp.down_proj.weight"))  # GPTQ act-order's, if any
            beside = moe is not None and config.dense_beside_moe
            shared = f"{p}mlp.shared_expert." if moe is not None and config.shared_expert_intermediate_size else None
            sandwich = fam.sandwich_norms
            self.layers.append(LayerWeights(
                input_norm=norm(f"{p}input_layernorm.weight"),
                qkv=fuse_rows(attn) if attn else None,
                qkv_bias=bias,
                o=take(f"{p}self_attn.o_proj.weight") if attn else None,
                post_norm=norm(f"{p}pre_feedforward_layernorm.weight" if sandwich else f"{p}post_attention_layernorm.weight"),
                gate_up=gate_up,
                down=down,
                q_norm=q_norm,
                k_norm=k_norm,
                attn_out_norm=norm(f"{p}post_attention_layernorm.weight") if sandwich else None,
                mlp_out_norm=norm(f"{p}post_feedforward_layernorm.weight") if sandwich else None,
                moe=moe,
                window=config.window(i),
                o_bias=take(f"{p}self_attn.o_proj.bias") if fam.all_biases else None,
                sinks=take(f"{p}self_attn.sinks").float() if fam.attention_sinks else None,
                kv_heads=config.kv_heads_of(i),
                head_dim=config.head_dim_of(i),
                kv_source=config.kv_source(i),
                v_from_k=v_from_k,
                per_layer_embed=row_slice(projection, slice(i * width, (i + 1) * width)) if width else None,
                per_layer_gate=take(f"{p}per_layer_input_gate.weight") if width else None,
                per_layer_proj=take(f"{p}per_layer_projection.weight") if width else None,
                per_layer_norm=maybe_norm(f"{p}post_per_layer_input_norm.weight"),
                scalar=take(f"{p}layer_scalar.weight").item() if f"{p}layer_scalar.weight" in state_dict else None,
                experts_in_norm=norm(f"{p}pre_feedforward_layernorm_2.weight") if beside else None,
                dense_out_norm=norm(f"{p}post_feedforward_layernorm_1.weight") if beside else None,
                experts_out_norm=norm(f"{p}post_feedforward_layernorm_2.weight") if beside else None,
                delta=delta,
                gate_rows=self.q_size if config.attention_output_gate and attn else 0,
                shared_gate_up=take_gate_up(shared) if shared else None,
                shared_down=take(f"{shared}down_proj.weight") if shared else None,
                # [1, hidden]; a quantized GGUF stores it as a vector
                shared_gate=take(f"{p}mlp.shared_expert_gate.weight").reshape(1, -1) if shared else None,
            ))
            if convert is not None:
                self.layers[-1].map_linears(convert)
        dims, positions = config.rope_table_dims(), max_positions or config.max_position_embeddings
        self.cos, self.signed_sin = rope_tables(config, self.device, dim=dims[0], positions=positions)
        # sliding-window layers with their own RoPE base (Gemma 3's 10k beside its global 1M), unscaled
        self.local_rope = None
        if config.rope_local_theta is not None:
            self.local_rope = rope_tables(config, self.device, theta=config.rope_local_theta, scaling=None,
                                          dim=dims[1], positions=positions)
        # The ops interface (ops/): C++ CPU kernels, Triton or torch, chosen here once.
        self.ops = select_ops(attention, self.device, dtype, self.kv_dtype,
                              math.gcd(*(layer.head_dim for layer in self.layers)))
        self.activation = {"silu": self.ops.silu_mul, "gelu_tanh": self.ops.gelu_tanh_mul,
                           "swiglu_oai": self.ops.swiglu_oai_mul}[fam.activation]

    def keeps_window_kv(self, layer: LayerWeights) -> bool:
        """Whether `layer`'s KV (its own, or the layer's whose it reads) sits in the sliding-window layers' pools,
        where they have their own (engine/window_blocks.py)."""
        return self.layers[layer.kv_source].window > 0

    def rope_of(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `layer`'s RoPE tables (cos, signed sin): a sliding layer's own base where the family has one."""
        if self.local_rope is not None and self.layers[layer].window:
            return self.local_rope
        return self.cos, self.signed_sin

    def allocate_kv_cache(self, num_blocks: int, block_size: int, state_slots: int = 0,
                          window_blocks: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A K and a V pool per layer, at its own geometry; a layer reading another's KV gets that layer's pools; a
        DeltaNet layer its `state_slots` sequences' state pools instead (models/delta_net.py). A sliding-window
        layer's pools hold window_blocks blocks where that is given (engine/window_blocks.py), else num_blocks."""
        pools = []
        for layer in self.layers:
            blocks = window_blocks if window_blocks and self.keeps_window_kv(layer) else num_blocks
            shape = (layer.kv_heads, blocks, block_size, layer.head_dim)  # heads outermost: see ops/attention.py
            if layer.delta is not None:
                pools.append(allocate_states(layer.delta, state_slots, self.dtype, self.device))
                continue
            pools.append(pools[layer.kv_source] if layer.kv_source != len(pools) else
                         (self._kv_pool(shape), self._kv_pool(shape)))
        return pools

    def _kv_pool(self, shape: tuple[int, ...]) -> torch.Tensor:
        if self.device.type == "cpu":  # on 2 MiB pages: a decode step reads a sequence's blocks all over the pool
            return huge_pages.zeros(shape, self.kv_dtype)
        return torch.zeros(shape, dtype=self.kv_dtype, device=self.device)

    def decode_weight_bytes(self) -> int:
        """Bytes of weights one decode step streams: every layer and the head (the embedding gives one row). An MoE
        layer counts the experts a token reads (top k of them), not all of them."""
        def size(w) -> int:
            return w.nbytes if isinstance(w, torch.Tensor) else w.nbytes()

        total = size(self.lm_head) + self.norm.nbytes
        for layer in self.layers:
            total += sum(size(w) for name, w in vars(layer).items() if isinstance(w, torch.Tensor) or
                         (name in LINEARS and w is not None))
            if layer.delta is not None:
                total += sum(size(getattr(layer.delta, name)) for name in DeltaNetWeights.LINEARS)
            if layer.moe is not None:
                experts = len(layer.moe.down)
                per_expert = sum(size(w) for w in (*layer.moe.gate_up, *layer.moe.down)) / experts
                total += size(layer.moe.router) + int(per_expert * self.config.num_experts_per_tok)
        return total

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttentionContext, kv_caches) -> torch.Tensor:
        x = self.parallel.embed(input_ids, self.embed)
        if self.embed_scale is not None:
            x = x * self.embed_scale
        ops, eps, reduce = self.ops, self.config.rms_norm_eps, self.parallel.all_reduce
        per_layer = None if self.per_layer_inputs is None else \
            (x.clone(), self.parallel.embed(input_ids, self.per_layer_inputs[0]))  # the embedding, the table's rows
        # every layer in one kernel call (CPU, block weights); not under tensor parallel, which all-reduces between
        if self.family.fused_decode and self.parallel.size == 1 and \
                ops.run_layers(self, x, positions, ctx, kv_caches, per_layer):
            return x
        delta = None  # each residual branch is added inside the next norm: one fused op
        # the rows that take decode arithmetic (quant/block_linear.py); None: all of them
        rows = ctx.decode_rows + ctx.verify_rows
        step_kv = {}  # this step's K and V rows of each layer that keeps its own: what a shared layer attends to
        for i, (layer, pools) in enumerate(zip(self.layers, kv_caches)):
            h = ops.add_rms_norm(x, delta, layer.input_norm, eps)
            if layer.delta is not None:  # a recurrence over each sequence's state (pools: the layer's state pools)
                out = delta_net(h, layer.delta, pools, ctx.states, eps, rows, ops)
            else:
                out = self.attend(i, layer, h, positions, ctx, pools, step_kv, rows)
            if layer.attn_out_norm is not None:
                out = ops.add_rms_norm(out, None, layer.attn_out_norm, eps)
            h = ops.add_rms_norm(x, out, layer.post_norm, eps)
            if layer.experts_in_norm is not None:
                delta = self.dense_and_experts(x, h, layer, rows)
            elif layer.moe is not None:
                delta = reduce(moe_mlp(h, layer.moe, self.config.num_experts_per_tok, self.config.norm_topk_prob,
                                       self.activation, rows, ops))
                if layer.shared_gate is not None:
                    shared = linear(self.activation(linear(h, layer.shared_gate_up, None, rows)), layer.shared_down,
                                    None, rows)
                    delta = delta + row_gate(h, layer.shared_gate) * reduce(shared)
            else:
                delta = reduce(linear(self.activation(linear(h, layer.gate_up, None, rows)), layer.down, None, rows))
            if layer.mlp_out_norm is not None:
                delta = ops.add_rms_norm(delta, None, layer.mlp_out_norm, eps)
            if layer.per_layer_gate is not None or layer.scalar is not None:
                x, delta = x.add_(delta), None
                if layer.per_layer_gate is not None:  # the layer's own input, gated by the stream into it
                    gated = F.gelu(linear(x, layer.per_layer_gate, None, rows), approximate="tanh")
                    gated.mul_(self.per_layer_input(i, layer, *per_layer, rows))
                    x.add_(ops.add_rms_norm(linear(gated, layer.per_layer_proj, None, rows), None,
                                            layer.per_layer_norm, eps))
                if layer.scalar is not None:
                    x.mul_(layer.scalar)
            if ctx.probe is not None and i == ctx.probe.layer:  # selective recompute: only the deviating rows go on
                kept, ctx = ctx.probe.narrow(step_kv[layer.kv_source][0])
                x, positions = x[kept], positions[kept]
                delta = None if delta is None else delta[kept]
                per_layer = None if per_layer is None else tuple(t[kept] for t in per_layer)
        return x if delta is None else x.add_(delta)

    def attend(self, i: int, layer: LayerWeights, h: torch.Tensor, positions: torch.Tensor, ctx: AttentionContext,
               kv_cache: tuple[torch.Tensor, torch.Tensor], step_kv: dict, rows: int | None) -> torch.Tensor:
        """Layer i's attention over the normed rows `h`, its output projected: it stores this step's K and V in its
        pools (and in step_kv, for the layers that share them), or reads an earlier layer's."""
        ops, eps, (k_cache, v_cache) = self.ops, self.config.rms_norm_eps, kv_cache
        if ctx.window is not None and self.keeps_window_kv(layer):
            ctx = ctx.window
        qkv = linear(h, layer.qkv, layer.qkv_bias, rows)
        if layer.gate_rows:
            qkv, gate = qkv[:, :-layer.gate_rows].contiguous(), qkv[:, -layer.gate_rows:]
        if layer.kv_source == i:
            if layer.v_from_k:  # V is K's projection, before K's norm and RoPE
                q_size = self.num_heads * layer.head_dim
                qkv = torch.cat([qkv, qkv[:, q_size:q_size + layer.kv_heads * layer.head_dim]], dim=1)
            if layer.q_norm is not None:
                ops.qk_rms_norm_(qkv, layer.q_norm, layer.k_norm, self.num_heads, layer.kv_heads, eps,
                                 v_norm=self.family.v_norm)
            q, k, v = ops.rope_and_store(qkv, positions, *self.rope_of(i), k_cache, v_cache, ctx, self.num_heads)
            step_kv[i] = k, v
        else:  # q alone, over the KV an earlier layer stored in these pools this step
            ops.qk_rms_norm_(qkv, layer.q_norm, None, self.num_heads, 0, eps)
            q = ops.rope_q(qkv, positions, *self.rope_of(i), ctx)
            k, v = step_kv[layer.kv_source]
        attn = ops.attention(q, k, v, k_cache, v_cache, ctx, self.scale, layer.window, layer.sinks)
        if layer.gate_rows:
            attn = attn * torch.sigmoid(gate).view_as(attn)
        return self.parallel.all_reduce(linear(attn, layer.o, layer.o_bias, rows))  # a rank adds bias / tp

    def dense_and_experts(self, x: torch.Tensor, h: torch.Tensor, layer: LayerWeights, rows: int | None) -> torch.Tensor:
        """Gemma 4's MoE layer on the stream `x` (`h`: its MLP norm): the dense MLP and the experts side by side,
        each output normed, summed. The router reads x's RMSNorm without a scale, the experts x under their own."""
        ops, eps, reduce = self.ops, self.config.rms_norm_eps, self.parallel.all_reduce  # each summed before its norm
        dense = reduce(linear(self.activation(linear(h, layer.gate_up, None, rows)), layer.down, None, rows))
        routed = F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)
        experts = reduce(moe_mlp(ops.add_rms_norm(x, None, layer.experts_in_norm, eps), layer.moe,
                                 self.config.num_experts_per_tok, self.config.norm_topk_prob, self.activation, rows,
                                 ops, router_input=routed))
        return ops.add_rms_norm(dense, None, layer.dense_out_norm, eps).add_(
            ops.add_rms_norm(experts, None, layer.experts_out_norm, eps))

    def per_layer_input(self, i: int, layer: LayerWeights, embedded: torch.Tensor, table_rows: torch.Tensor,
                        rows: int | None) -> torch.Tensor:
        """Gemma 4's input of layer i, [T, width]: the layer's rows of the per-layer table (times sqrt(width)) and its
        normed projection of the embedding, averaged in norm (times 1 / sqrt(2))."""
        width = self.config.per_layer_input_size
        tokens = table_rows[:, i * width:(i + 1) * width] * torch.tensor(width**0.5, dtype=table_rows.dtype)
        projected = linear(embedded, layer.per_layer_embed, None, rows) * self.config.hidden_size**-0.5
        projected = self.ops.add_rms_norm(projected, None, self.per_layer_inputs[1], self.config.rms_norm_eps)
        return (projected + tokens) * 2**-0.5

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits for the given rows of hidden states."""
        logits = linear(self.ops.add_rms_norm(hidden.contiguous(), None, self.norm, self.config.rms_norm_eps),
                        self.lm_head).float()
        cap = self.config.final_logit_softcap
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return self.parallel.gather_logits(logits, self.config.vocab_size)
