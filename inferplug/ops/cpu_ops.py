"""inferplug's C++ CPU kernels (inferplug/kernels/cpu) as the ops set: fp32 on an AVX2 (or AVX-512) CPU, the K/V
pools fp32 or fp16 (the store rounds to fp16, attention widens each tile back to fp32 as it reads it).

Attention takes every row of a step, prefill rows too, in the paged attention kernel (flash tiles over the paged
K/V; a decode row is its one-row case): each query reads the K/V of its own position and those before it in one fixed order, so a token's attention does not depend on the step's other
rows, on how its prompt was chunked, or on whether its prefix came from the cache (batch invariance)."""

from __future__ import annotations

import torch

from inferplug.kernels.delta_rule_ref import CHUNK
from inferplug.ops.attention import AttentionContext, PagedRows
from inferplug.ops.step import StepLayout
from inferplug.ops.torch_ops import TorchOps
from inferplug.quant.block_linear import KERNEL_MAX_ROWS, BlockLinear
from inferplug.quant.checkpoint_layers import PermutedLinear, RowPartsLinear

BLOCK_KINDS = {"q4_matmul": 4, "q4_k_matmul": 5, "q4_g128_matmul": 6, "q6_k_matmul": 7, "q8_matmul": 8,
               "q5_k_matmul": 9, "q5_0_matmul": 10, "mxfp4_matmul": 11}  # BlockLinear.kernel -> decode_layers' weight kind


class CpuKernelOps(TorchOps):
    name = "cpu-kernels"

    def __init__(self, kernels, dtype: torch.dtype = torch.float32, *, head_dim: int):
        super().__init__(dtype)
        self.kernels = kernels  # torch.ops.inferplug, loaded (kernels.cpu.ops())
        self.paged_kernel = head_dim % 8 == 0  # the attention kernel's vectors; other widths take torch attention
        self.in_order = torch.empty(0, dtype=torch.long)  # decode_layers' order of a weight whose inputs are in order
        self.absent = torch.empty(0, dtype=torch.uint8)  # decode_layers' absent second q/k/v part, bias or sinks

    def context(self, step: StepLayout, slot_mapping: torch.Tensor) -> AttentionContext:
        if not self.paged_kernel:
            return super().context(step, slot_mapping)
        ctx = AttentionContext(slot_mapping, len(step.decodes), step.verify_rows)
        ctx.paged_rows = [self._kernel_rows(step, slot_mapping.device)]
        return ctx

    def _kernel_rows(self, step: StepLayout, device: torch.device) -> PagedRows:
        """Every row of the step, decode and prefill alike: one block table, row span and context length per
        sequence. The kernel computes each row at its own position over key tiles at absolute positions, so a
        token's attention does not depend on the step's other rows, its chunking or its prefix-cache hits."""
        spans = step.decodes + step.prefills
        width = max(-(-(s.num_computed_tokens + n) // step.block_size) for s, n in spans)
        starts = [0]
        for _, n in spans:
            starts.append(starts[-1] + n)
        lengths = torch.tensor([s.num_computed_tokens + n for s, n in spans], dtype=torch.long, device=device)
        return PagedRows(0, starts[-1], step.padded_tables([s for s, _ in spans], width, device), None,
                           lengths=lengths, query_starts=torch.tensor(starts, dtype=torch.long, device=device))

    def attention(self, q, k, v, k_cache, v_cache, ctx: AttentionContext, scale: float, window: int = 0,
                  sinks: torch.Tensor | None = None) -> torch.Tensor:
        if not self.paged_kernel:
            return super().attention(q, k, v, k_cache, v_cache, ctx, scale, window, sinks)
        rows = ctx.paged_rows[0]
        return self.kernels.paged_attention(q, k_cache, v_cache, rows.block_tables, rows.query_starts, rows.lengths,
                                            scale, window=window, sinks=sinks).flatten(1)

    def rope_and_store(self, qkv, positions, cos, signed_sin, k_cache, v_cache, ctx: AttentionContext, num_heads: int):
        """RoPE in place on qkv and the K/V store, in one kernel."""
        self.kernels.rope_write_kv_(qkv, positions, cos, signed_sin, k_cache, v_cache, ctx.slot_mapping, num_heads)
        kv_heads = (qkv.shape[1] // cos.shape[-1] - num_heads) // 2
        return qkv.view(qkv.shape[0], -1, cos.shape[-1]).split([num_heads, kv_heads, kv_heads], dim=1)

    def add_rms_norm(self, x, delta, weight, eps: float) -> torch.Tensor:
        return self.kernels.rms_norm(x, weight, eps) if delta is None else self.kernels.add_rms_norm_(x, delta, weight, eps)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return self.kernels.silu_mul(gate_up)

    def qk_rms_norm_(self, qkv, q_norm, k_norm, num_heads: int, kv_heads: int, eps: float,
                     v_norm: bool = False) -> None:
        """In place, one kernel (kernels/cpu/rms_norm.cpp), for fp32 rows; V's norm (Gemma 4) in torch ops."""
        if v_norm or any(t is not None and t.dtype != torch.float32 for t in (qkv, q_norm, k_norm)) or \
                not qkv.is_contiguous():
            return super().qk_rms_norm_(qkv, q_norm, k_norm, num_heads, kv_heads, eps, v_norm)
        self.kernels.qk_rms_norm_(qkv, q_norm.contiguous(), None if k_norm is None else k_norm.contiguous(), num_heads,
                                  kv_heads, eps)

    def delta_rule_step(self, state_pool, slots, q, k, v, g, beta) -> torch.Tensor:
        """In place on the slots' states, one pass (kernels/cpu/delta_rule.cpp)."""
        return self.kernels.delta_rule_step_(state_pool, slots, q.contiguous(), k.contiguous(), v.contiguous(),
                                             g.contiguous(), beta.contiguous())

    def delta_net_step(self, w, pools, slots, mixed, b, a, z, eps: float) -> torch.Tensor | None:
        """One kernel (kernels/cpu/delta_rule.cpp) for fp32 models; the torch ops for others."""
        conv_pool, state_pool = pools
        if any(t.dtype != torch.float32 for t in (conv_pool, mixed, b, a, z, w.conv, w.norm)):
            return None
        return self.kernels.delta_net_step_(conv_pool, state_pool, slots, mixed.contiguous(), b.contiguous(),
                                            a.contiguous(), z.contiguous(), w.conv.contiguous(), w.dt_bias, w.neg_a,
                                            w.norm, w.key_of_value, w.key_heads, eps)

    def delta_net_prompt(self, w, pools, slot: int, fresh: bool, mixed, b, a, z, eps: float) -> torch.Tensor | None:
        """One kernel (kernels/cpu/delta_rule.cpp) for fp32 models; the torch ops for others."""
        conv_pool, state_pool = pools
        if any(t.dtype != torch.float32 for t in (conv_pool, mixed, b, a, z, w.conv, w.norm)):
            return None
        return self.kernels.delta_net_prompt_(conv_pool, state_pool, slot, fresh, mixed.contiguous(), b.contiguous(),
                                              a.contiguous(), z.contiguous(), w.conv.contiguous(), w.dt_bias,
                                              w.neg_a, w.norm, w.key_of_value, w.key_heads, eps, CHUNK)

    def chunked_delta_rule(self, q, k, v, g, beta, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A value head a work item, the chunks in the kernel (kernels/cpu/delta_chunks.h), on the reference's grid."""
        return self.kernels.chunked_delta_rule_(*(t.contiguous() for t in (q, k, v, g, beta, state)), CHUNK)

    def swiglu_oai_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return self.kernels.swiglu_oai_mul(gate_up)

    def gelu_tanh_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return self.kernels.gelu_tanh_mul(gate_up)

    def router_logits(self, h: torch.Tensor, router: torch.Tensor) -> torch.Tensor:
        """In one kernel (kernels/cpu/layer_ops.cpp), each logit in one order as torch's form is, without writing
        its [T, experts, hidden] products."""
        if h.dtype != torch.float32 or router.dtype != torch.float32:
            return super().router_logits(h, router)
        return self.kernels.router_logits(h.contiguous(), router.contiguous())

    def moe_experts(self, h, chosen, weights, moe, decode_rows, activation):
        """Block experts in one kernel call a layer (kernels/cpu/moe_experts.cpp): decode rows on the int8 kernels,
        prefill rows on the layers' prefill path, with gpt-oss's biases and activation and Gemma 4's GeGLU. Where the
        layers' prompt rows go through oneDNN, the experts' take our own bf16 kernel instead: a oneDNN call an
        expert is the per-expert loop, which ran a Qwen3.5-35B-A3B prefill at a quarter of llama.cpp's speed (256
        experts, ~16 rows each, on a Zen 4 host where oneDNN timed fastest on dense layers), and ours is the more
        accurate of the two (float32 out, not bf16). None, for the per-expert loop, where the call does not fit:
        float experts, or gate and up in two formats."""
        blocks = moe.blocks()
        activations = {self.silu_mul: "silu", self.swiglu_oai_mul: "swiglu_oai", self.gelu_tanh_mul: "gelu_tanh"}
        name = activations.get(activation)
        if blocks is None or name is None or h.shape[1] != moe.down[0].out_features:
            return None
        rows = h.shape[0] if decode_rows is None else min(decode_rows, h.shape[0])
        prefill = moe.gate_up[0].prefill_gemm
        parts = [(0, rows, "int8"), (rows, h.shape[0], "bfloat16" if prefill == "bfloat16-onednn" else prefill)]
        biases = [None if b is None else b.float() for b in (moe.gate_up_bias, moe.down_bias)]  # fp32: a no-op
        outs = [self.kernels.moe_experts(h[a:b], chosen[a:b], weights[a:b], *blocks, precision, *biases, name)
                for a, b, precision in parts if b > a]
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def run_layers(self, model, x, positions, ctx: AttentionContext, kv_caches, per_layer=None) -> bool:
        """Decode steps whose every layer weight is blocks the kernels run (GPTQ act-order ones too, their inputs
        gathered in the call): every layer in one C++ call, the same kernels without Python between them."""
        blocks = self.block_layers(model, ctx, x.shape[0])
        experts = None if blocks is None else self.block_experts(model)
        nets = None if experts is None else self.block_delta_nets(model, ctx, kv_caches)
        if nets is None:
            return False
        group = ctx.paged_rows[0]
        local_cos, local_sin = model.local_rope or (None, None)
        own = ctx.window  # the sliding-window layers' own pools, where they have them
        layers = model.layers
        biases = [self.absent if b is None else b for layer in layers for b in (layer.qkv_bias, layer.o_bias)]
        sinks = [self.absent if layer.sinks is None else layer.sinks for layer in layers]
        self.kernels.decode_layers(x, *blocks, [k for k, _ in kv_caches], [v for _, v in kv_caches], positions,
                                   model.cos, model.signed_sin, ctx.slot_mapping, group.block_tables, group.lengths,
                                   model.num_heads, model.scale, model.config.rms_norm_eps,
                                   biases=biases if any(b.numel() for b in biases) else [],
                                   sinks=sinks if any(t.numel() for t in sinks) else [],
                                   windows=[layer.window for layer in layers], local_cos=local_cos,
                                   local_sin=local_sin, sandwich=model.family.sandwich_norms,
                                   activation=model.family.activation,
                                   window_slots=None if own is None else own.slot_mapping,
                                   window_tables=None if own is None else own.paged_rows[0].block_tables,
                                   kv_sources=[layer.kv_source for layer in layers],
                                   v_from_k=[int(layer.v_from_k) for layer in layers], v_norm=model.family.v_norm,
                                   per_layer_inputs=None if per_layer is None else torch.stack(
                                       [model.per_layer_input(i, layer, *per_layer, None) for i, layer in enumerate(layers)]),
                                   scalars=[1.0 if layer.scalar is None else layer.scalar for layer in layers]
                                   if any(layer.scalar is not None for layer in layers) else [], **experts, **nets)
        return True

    def block_experts(self, model) -> dict | None:
        """decode_layers' MoE arguments: none for a dense stack; for a stack whose every layer is moe_mlp's MoE (a
        softmax router in fp32, its top k, block experts in one call: Qwen3-MoE's; gpt-oss's with the router's and
        experts' biases; Gemma 4 26B-A4B's with the router's and experts' scales, beside a dense MLP in every layer;
        Qwen3.5-MoE's with a shared expert in every layer), each layer's router, expert tables, those parts and
        shared expert's gate; None where the stack mixes them or has another kind."""
        if all(layer.moe is None for layer in model.layers):
            return dict(routers=[], expert_tables=[], expert_parts=[], shared_gates=[])
        routers, tables, rows, kinds, parts, shared = [], [], [], [], [], []
        beside = model.layers[0].experts_in_norm is not None
        with_shared = model.layers[0].shared_gate is not None
        for layer in model.layers:
            moe = layer.moe
            if moe is None or (layer.experts_in_norm is not None) != beside or moe.router.dtype != torch.float32 or \
                    (layer.shared_gate is not None) != with_shared or beside and with_shared:
                return None
            shared.append(self.absent if layer.shared_gate is None else layer.shared_gate)  # Qwen3.5-MoE's
            blocks = moe.blocks()
            if blocks is None or any(f"{name}_matmul" not in BLOCK_KINDS for name in blocks[3:]):
                return None
            routers.append(moe.router.contiguous())
            tables += blocks[:2]
            rows.append(blocks[2])
            kinds += [BLOCK_KINDS[f"{name}_matmul"] for name in blocks[3:]]
            parts += [self.absent if t is None else t.float() if i in (1, 2) else t  # the experts' biases in fp32, as moe_experts
                      for i, t in enumerate((moe.router_bias, moe.gate_up_bias, moe.down_bias, moe.router_scale,
                                             moe.expert_scale))]
        return dict(routers=routers, expert_tables=tables, expert_rows=rows, expert_kinds=kinds,
                    top_k=model.config.num_experts_per_tok, renormalize=model.config.norm_topk_prob,
                    expert_parts=parts if any(t.numel() for t in parts) else [], dense_beside_experts=beside,
                    shared_gates=shared if any(t.numel() for t in shared) else [])

    def block_delta_nets(self, model, ctx: AttentionContext, kv_caches) -> dict | None:
        """decode_layers' Qwen3.5 arguments: each attention layer's output-gate rows, and each Gated DeltaNet layer's
        conv weight, dt_bias, -exp(A_log), norm and value heads' key heads with the step's state slots (each row a
        sequence's next token, in order); none for a stack without them. None where a row starts its state afresh or
        the layers are not fp32 (the one-call step's, ops.delta_net_step)."""
        layers = model.layers
        gates = [layer.gate_rows for layer in layers]
        nets = [(layer.delta, pools[0]) for layer, pools in zip(layers, kv_caches) if layer.delta is not None]
        if not nets:
            return dict(delta_parts=[], gate_rows=gates if any(gates) else [])
        if any(n != 1 or fresh for n, _, fresh in ctx.states) or \
                any(t.dtype != torch.float32 for w, conv_pool in nets for t in (conv_pool, w.conv, w.norm)):
            return None
        parts = [t for layer in layers for t in ((self.absent,) * 5 if layer.delta is None else (
            layer.delta.conv.contiguous(), layer.delta.dt_bias, layer.delta.neg_a, layer.delta.norm,
            layer.delta.key_of_value))]
        slots = torch.tensor([slot for _, slot, _ in ctx.states], dtype=torch.long)
        return dict(delta_parts=parts, gate_rows=gates, state_slots=slots, key_heads=nets[0][0].key_heads)

    def block_layers(self, model, ctx: AttentionContext, tokens: int):
        """(norms, weights, kinds, orders) for decode_layers, or None where the step cannot take it: it must be
        decode rows only (prefill rows take float matmuls), and every layer weight blocks run by their kernels (the
        biases of q/k/v and o are the layer's own, run_layers' to give) (at most KERNEL_MAX_ROWS rows). Per layer five weights: q/k/v, a second part
        of q/k/v in another format (RowPartsLinear) or none (kind 0), o, gate/up, down (an MoE layer's shared
        expert's, or none), and two more with Gemma 4's per-layer inputs (their gate and projection) or Qwen3.5's
        DeltaNet layers (whose five are in_proj_qkv, z, out_proj, the MLP's two, then b and a; its attention layers'
        slot 5 a third part of q/k/v or none); two norms a layer,
        four with QK-norm (a DeltaNet layer's two more unused), two more with sandwich norms, three more with a dense
        MLP beside the experts, one more with per-layer inputs. An act-order weight (PermutedLinear) gives its blocks and its input order; the
        others an empty order."""
        if not self.paged_kernel or ctx.decode_rows != tokens or tokens > KERNEL_MAX_ROWS:
            return None
        norms, weights, kinds, orders = [], [], [], []
        gated_inputs = model.per_layer_inputs is not None
        qk_norm = any(layer.q_norm is not None for layer in model.layers)
        nets = any(layer.delta is not None for layer in model.layers)
        if gated_inputs and nets:  # both would take slots 5 and 6 (7 weights a layer, not 5)
            return None
        for layer in model.layers:
            net = layer.delta
            norms += [layer.input_norm, layer.post_norm]
            if layer.q_norm is not None:  # QK-norm (Qwen3, Gemma 3): two more (a layer reading another's KV has no k's)
                norms += [layer.q_norm, layer.q_norm if layer.k_norm is None else layer.k_norm]
            elif qk_norm and net is not None:  # a DeltaNet layer among QK-normed ones (Qwen3.5): two, unused
                norms += [layer.input_norm, layer.input_norm]
            if layer.attn_out_norm is not None:  # sandwich norms (Gemma 3): two more
                norms += [layer.attn_out_norm, layer.mlp_out_norm]
            if layer.experts_in_norm is not None:  # a dense MLP beside the experts (Gemma 4 26B-A4B): three more
                norms += [layer.experts_in_norm, layer.dense_out_norm, layer.experts_out_norm]
            if gated_inputs:  # Gemma 4's per-layer input: its norm, last
                norms.append(layer.per_layer_norm)
            if net is not None:  # a Gated DeltaNet: in_proj_qkv and z, out_proj, ..., b and a
                qkv, o, tail = [net.qkv, net.z], net.out, (net.b, net.a)
            else:
                parts = list(layer.qkv.parts) if isinstance(layer.qkv, RowPartsLinear) else [layer.qkv]
                if len(parts) > (3 if nets else 2):  # a third part goes in slot 5 (Qwen3.5's: its output gate's rows)
                    return None
                parts += [None] * (3 - len(parts))
                qkv, o = parts[:2], layer.o
                tail = [layer.per_layer_gate, layer.per_layer_proj] if gated_inputs else [parts[2], None] if nets else []
            # the MLP, or an MoE layer's shared expert (Qwen3.5-MoE)
            mlp = (layer.shared_gate_up, layer.shared_down) if layer.shared_gate_up is not None else (layer.gate_up, layer.down)
            for w in (*qkv, o, *mlp, *tail):
                order = self.in_order
                if isinstance(w, PermutedLinear):
                    order, w = w.order, w.inner
                if w is None:  # no second q/k/v part, MLP or last two
                    weights.append(self.absent)
                    kinds.append(0)
                    orders.append(order)
                    continue
                if not isinstance(w, BlockLinear) or w.kernel not in BLOCK_KINDS or w.bias is not None:
                    return None
                weights.append(w.blocks)
                kinds.append(BLOCK_KINDS[w.kernel])
                orders.append(order)
        return norms, weights, kinds, orders
