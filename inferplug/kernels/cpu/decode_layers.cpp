// Every decoder layer of a decode step in one call, when the layers' weights are the block formats below: the
// same kernels, in the same order, as DecoderModel.forward calls them one by one from Python, so the result
// is bit for bit the same. At one token a step the Python between ~300 kernel calls cost about as much
// as the layers' arithmetic.
// GPTQ act-order weights (desc_act) have their input columns permuted at load; the matmul gathers their inputs in
// the same order as it quantizes them (quant/checkpoint_layers.py's PermutedLinear uses index_select on the
// layer-by-layer path).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace {

template <typename Signature>
c10::TypedOperatorHandle<Signature> op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

using Matmul = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&);

// x: the step's hidden states [T, hidden], one row per sequence, updated in place to the last layer's
// residual stream. Per layer: its input and post-attention RMSNorm weights, then with QK-norm (Qwen3, Gemma 3) q's and
// k's per-head weights (applied before RoPE), then with `sandwich` (Gemma 3) the norms of the attention's and the
// MLP's outputs (applied before each residual add): 2, 4 or 6 norms a layer;
// weights[5i..5i+4] (qkv, a second qkv part, o, gate_up, down blocks) with kinds[5i..5i+4] (4: Q4_1, 5: Q4_K,
// 6: Q4_G128, 7: Q6_K, 8: Q8_0, 9: Q5_K, 10: Q5_0, 11: MXFP4; 0 for no second qkv part: its weight is then unused) and orders[5i..5i+4] (an act-order
// weight's input permutation, empty for a weight whose inputs are in order). A second qkv part is the next output
// rows in another format (quant/checkpoint_layers.py RowPartsLinear: a Q4_K_M's Q6_K attn_v beside Q4_K q/k); its K/V pools
// (float32 or float16: rope_write_kv_ and paged_decode take either).
// `windows` (empty, or one a layer): a layer's sliding window (0: none), its attention then reading only that many
// keys, and its RoPE from local_cos / local_sin where given (Gemma 3's 10k base), its K/V stored at window_slots and
// read through window_tables where given (the window group's own pools: engine/window_blocks.py). `activation`: the
// gated MLP's and the experts' ("silu", "gelu_tanh" or "swiglu_oai", layer_ops.cpp's).
// gpt-oss and Qwen2: `biases` (empty, or two a layer: q/k/v's and o's, an empty tensor for none) added to those
// projections' outputs; `sinks` (empty, or one a layer: empty for none) each head's sink logit in its layer's softmax.
// Gemma 4 (each layer's head size is its K pool's): `kv_sources` (empty, or one a layer) a layer's KV source, a layer
// that reads an earlier one's KV projecting and rotating q alone; `v_from_k` (empty, or one a layer: 1 where V is K's
// projection); `v_norm`: each V head RMS-normed without a scale; `per_layer_inputs` (none, or [layers, T, width])
// each layer's input, gated into the stream after its MLP by two more weights a layer (7 a layer, not 5: the gate
// and the projection) and one more norm, last; `scalars` (empty, or one a layer) each layer's output scale.
// A mixture-of-experts stack (Qwen3-MoE: models/moe.py moe_mlp's plain form, SwiGLU experts): `routers` (empty, or
// one fp32 router a layer) whose softmax's top_k experts (renormalized to sum to 1 with `renormalize`) a row takes,
// through moe_experts' one call a layer on the decode rows' kernels: `expert_tables` (two a layer: gate/up's and
// down's int64 tables of each expert's block addresses), `expert_rows` (gate/up's rows, one a layer) and
// `expert_kinds` (two a layer, as kinds); the layer's gate_up and down weights are then none (kind 0).
// `expert_parts` (empty, or five a layer, an empty tensor for none): the router's bias and the experts' gate/up and
// down biases in fp32 (gpt-oss), the router's input scale and each expert's output scale (Gemma 4).
// `dense_beside_experts` (Gemma 4 26B-A4B, models/decoder.py dense_and_experts): the layer's gate_up and down are a
// dense MLP run beside the experts, the router reads the stream's RMSNorm without a scale, the experts the stream
// under their own norm, and each output is normed before the two are summed: 3 more norms a layer (the experts'
// input norm, the dense output's and the experts' output's), after the sandwich norms.
// Qwen3.5: `gate_rows` (empty, or one a layer) the rows of q/k/v's projection, last, whose sigmoid gates the
// attention's output; Gated DeltaNet layers, where `delta_parts` (empty, or five a layer, empty tensors for an
// attention layer) gives a layer's conv weight, dt_bias, -exp(A_log), norm and each value head's key head, its K and V
// pools are its conv and state pools and `state_slots` each row's state slot (`key_heads` q/k heads); its weights
// are in_proj_qkv, z, out_proj, the MLP's two and b, a (7 a layer), and an attention layer's slot 5 a third part of
// its q/k/v (a Q4_K_M's q and k, its Q6_K v, and its output gate's rows in q's format). `shared_gates` (empty, or one a layer): an MoE
// layer's shared expert, its gate/up and down in the MLP's two slots, added times sigmoid(shared_gate . h).
// Ends with x plus the last layer's MLP output in x (DecoderModel.forward's result).
void decode_layers(at::Tensor& x, at::TensorList norms, at::TensorList weights, at::IntArrayRef kinds,
                   at::TensorList orders, at::TensorList k_caches, at::TensorList v_caches, const at::Tensor& positions,
                   const at::Tensor& cos, const at::Tensor& signed_sin, const at::Tensor& slots, const at::Tensor& block_tables,
                   const at::Tensor& lengths, int64_t num_heads, double scale, double eps, at::TensorList routers,
                   at::TensorList expert_tables, at::TensorList biases, at::TensorList sinks,
                   at::TensorList expert_parts, at::TensorList delta_parts, at::TensorList shared_gates,
                   at::IntArrayRef windows,
                   const c10::optional<at::Tensor>& local_cos, const c10::optional<at::Tensor>& local_sin, bool sandwich,
                   const std::string& activation, const c10::optional<at::Tensor>& window_slots, const c10::optional<at::Tensor>& window_tables,
                   at::IntArrayRef kv_sources, at::IntArrayRef v_from_k, bool v_norm,
                   const c10::optional<at::Tensor>& per_layer_inputs, at::ArrayRef<double> scalars,
                   at::IntArrayRef expert_rows, at::IntArrayRef expert_kinds, int64_t top_k, bool renormalize,
                   bool dense_beside_experts, at::IntArrayRef gate_rows,
                   const c10::optional<at::Tensor>& state_slots, int64_t key_heads) {
  const int64_t layers = static_cast<int64_t>(k_caches.size());
  const bool gated_inputs = per_layer_inputs.has_value();
  auto is_delta_net = [&](int64_t i) { return !delta_parts.empty() && delta_parts[5 * i].numel() > 0; };
  const int64_t stride = gated_inputs || !delta_parts.empty() ? 7 : 5;  // weights a layer
  const int64_t per_layer = k_caches.size() ? static_cast<int64_t>(norms.size()) / layers : 0;  // 2 to 10
  const int64_t attention_norms = per_layer - (sandwich ? 2 : 0) - (dense_beside_experts ? 3 : 0) - (gated_inputs ? 1 : 0);
  const int64_t moe_norms = attention_norms + (sandwich ? 2 : 0);  // a dense-beside-experts layer's 3
  const bool qk_norm = attention_norms == 4;
  auto per_layer_list = [layers](size_t size) { return size == 0 || static_cast<int64_t>(size) == layers; };
  TORCH_CHECK(layers > 0 && v_caches.size() == k_caches.size() && (attention_norms == 2 || qk_norm) &&
              static_cast<int64_t>(norms.size()) == per_layer * layers &&
              static_cast<int64_t>(weights.size()) == stride * layers && kinds.size() == weights.size() &&
              orders.size() == weights.size() && per_layer_list(windows.size()) && per_layer_list(kv_sources.size()) &&
              per_layer_list(v_from_k.size()) && (!gated_inputs || per_layer_inputs->size(0) == layers) &&
              per_layer_list(scalars.size()) && per_layer_list(routers.size()) &&
              expert_tables.size() == 2 * routers.size() && expert_rows.size() == routers.size() &&
              expert_kinds.size() == 2 * routers.size() && (routers.empty() || top_k > 0) &&
              (biases.empty() || static_cast<int64_t>(biases.size()) == 2 * layers) && per_layer_list(sinks.size()) &&
              (expert_parts.empty() || expert_parts.size() == 5 * routers.size()) &&
              (!dense_beside_experts || !routers.empty()) && per_layer_list(gate_rows.size()) &&
              (delta_parts.empty() || (static_cast<int64_t>(delta_parts.size()) == 5 * layers && state_slots.has_value() &&
                                       !gated_inputs)) &&  // slots 5 and 6: b and a, or the per-layer inputs
              per_layer_list(shared_gates.size()) && (shared_gates.empty() || !routers.empty()) &&
              local_cos.has_value() == local_sin.has_value() && window_slots.has_value() == window_tables.has_value(),
              "decode_layers: per layer, 2 norms (4 with QK-norm, 2 more with sandwich norms, 3 more with a dense MLP "
              "beside the experts, 1 more with per-layer inputs), 5 weights (7 with per-layer inputs or DeltaNet layers) with their kinds and input orders, a K and a V pool, and a "
              "window, a KV source, a V-from-K flag, an input, a scale, two biases, sinks, an output gate's rows, five "
              "DeltaNet parts (with state slots), a router with its experts' two tables, rows, kinds and five parts, and "
              "a shared expert's gate (or none of each for every layer)");
  TORCH_CHECK(activation == "silu" || activation == "gelu_tanh" || activation == "swiglu_oai",
              "decode_layers: activation must be silu, gelu_tanh or swiglu_oai, got '", activation, "'");
  // kinds 4..11: their matmuls, and moe_experts' names of them
  static const char* formats[] = {"q4", "q4_k", "q4_g128", "q6_k", "q8", "q5_k", "q5_0", "mxfp4"};
  static const std::vector<c10::TypedOperatorHandle<Matmul>> matmuls = [] {
    std::vector<c10::TypedOperatorHandle<Matmul>> ops;
    for (const char* format : formats) ops.push_back(op<Matmul>(("inferplug::" + std::string(format) + "_matmul").c_str()));
    return ops;
  }();
  static const auto rms_norm = op<at::Tensor(const at::Tensor&, const at::Tensor&, double)>("inferplug::rms_norm");
  static const auto add_rms_norm = op<at::Tensor(at::Tensor&, const at::Tensor&, const at::Tensor&, double)>("inferplug::add_rms_norm_");
  static const auto qk_rms_norm = op<void(at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, int64_t, int64_t,
                                          double)>("inferplug::qk_rms_norm_");
  static const auto rope_write_kv = op<void(at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, at::Tensor&,
                                            at::Tensor&, const at::Tensor&, int64_t)>("inferplug::rope_write_kv_");
  static const auto paged_decode = op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                 const at::Tensor&, double)>("inferplug::paged_decode");
  static const auto paged_attention = op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                    const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                                                    const c10::optional<at::Tensor>&, int64_t,
                                                    const c10::optional<at::Tensor>&)>("inferplug::paged_attention");
  static const auto router_logits = op<at::Tensor(const at::Tensor&, const at::Tensor&)>("inferplug::router_logits");
  static const auto moe_experts = op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                const at::Tensor&, int64_t, const std::string&, const std::string&,
                                                const std::string&, const c10::optional<at::Tensor>&,
                                                const c10::optional<at::Tensor>&, const std::string&)>("inferplug::moe_experts");
  static const auto delta_net_step = op<at::Tensor(at::Tensor&, at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                   const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                   const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                   const at::Tensor&, const at::Tensor&, int64_t, double)>(
      "inferplug::delta_net_step_");
  using Glu = at::Tensor(const at::Tensor&);
  static const auto silu_mul = op<Glu>("inferplug::silu_mul"), gelu_tanh_mul = op<Glu>("inferplug::gelu_tanh_mul"),
                    swiglu_oai_mul = op<Glu>("inferplug::swiglu_oai_mul");
  const auto& glu = activation == "silu" ? silu_mul : activation == "gelu_tanh" ? gelu_tanh_mul : swiglu_oai_mul;
  auto known_kind = [](int64_t kind) { return kind >= 4 && kind <= 11; };
  auto linear = [&](const at::Tensor& in, int64_t w) {
    TORCH_CHECK(known_kind(kinds[w]), "decode_layers: weight kind must be 4 (Q4_1), 5 (Q4_K), 6 (Q4_G128), 7 (Q6_K), "
                "8 (Q8_0), 9 (Q5_K), 10 (Q5_0) or 11 (MXFP4), got ", kinds[w]);
    // an act-order weight's inputs are gathered as the matmul quantizes them
    const std::optional<at::Tensor> order = orders[w].numel() ? std::optional<at::Tensor>(orders[w]) : std::nullopt;
    return matmuls[kinds[w] - 4].call(in, weights[w], order);
  };
  // a projection's output plus its bias b (linear's `out + bias` on the layer-by-layer path), where it has one
  auto plus_bias = [&](const at::Tensor& out, int64_t b) {
    return biases.empty() || !biases[b].numel() ? out : out + biases[b];
  };
  // sigmoid(weight . h) a row, as ops/row_math.py row_gate: the logit padded to a whole vector step (by_rows)
  auto row_gate = [](const at::Tensor& h, const at::Tensor& weight) {
    const at::Tensor logits = (h.to(at::kFloat) * weight.to(at::kFloat)).sum(-1, true);
    return at::sigmoid(at::constant_pad_nd(logits, {0, 31}, 0))  // one logit padded to row_math's LANES (32)
        .narrow(-1, 0, 1)
        .to(h.scalar_type());
  };
  // layer i's experts on its normed rows h, as moe_mlp (models/moe.py) with the router reading router_input: its
  // softmax, its top k (renormalized, times the experts' scales), one call
  auto experts = [&](const at::Tensor& h, int64_t i, const at::Tensor& router_input) {
    for (const int64_t kind : {expert_kinds[2 * i], expert_kinds[2 * i + 1]})
      TORCH_CHECK(known_kind(kind), "decode_layers: an expert kind must be 4..11, got ", kind);
    const auto part = [&](int64_t j) {  // none where the list, or the part's tensor, is empty
      const bool given = !expert_parts.empty() && expert_parts[5 * i + j].numel();
      return given ? std::optional<at::Tensor>(expert_parts[5 * i + j]) : std::nullopt;
    };
    const auto router_bias = part(0), router_scale = part(3), expert_scale = part(4);
    const at::Tensor scaled = router_scale ? router_input * *router_scale * std::pow(router_scale->size(0), -0.5)
                                           : router_input;
    at::Tensor logits = router_logits.call(scaled, routers[i]);
    if (router_bias) logits = logits + *router_bias;
    auto [shares, chosen] = at::softmax(logits.to(at::kFloat), -1).topk(top_k, -1);
    if (renormalize) shares = shares / shares.sum(-1, true);
    if (expert_scale) shares = shares * expert_scale->index({chosen});
    return moe_experts.call(h, chosen, shares.to(h.scalar_type()), expert_tables[2 * i], expert_tables[2 * i + 1],
                            expert_rows[i], formats[expert_kinds[2 * i] - 4], formats[expert_kinds[2 * i + 1] - 4],
                            "int8", part(1), part(2), activation);
  };

  const int64_t tokens = x.size(0);
  const at::Tensor starts = at::arange(tokens + 1, at::kLong);  // a windowed layer's rows: one a sequence
  std::optional<at::Tensor> delta;
  // layer i's attention over its normed rows h, its output projected (n, w: its first norm and weight)
  auto attend = [&](const at::Tensor& h, int64_t i, int64_t n, int64_t w) {
    at::Tensor k_cache = k_caches[i], v_cache = v_caches[i];
    const int64_t head_dim = k_cache.size(3);
    const bool own_kv = kv_sources.empty() || kv_sources[i] == i;
    std::vector<at::Tensor> parts{linear(h, w)};  // q/k/v's parts (RowPartsLinear's), a third in slot 5 if given
    if (kinds[w + 1]) parts.push_back(linear(h, w + 1));
    if (!delta_parts.empty() && kinds[w + 5]) parts.push_back(linear(h, w + 5));  // a stack with DeltaNet layers
    at::Tensor qkv = plus_bias(parts.size() == 1 ? parts[0] : at::cat(parts, 1), 2 * i);
    const int64_t gate = gate_rows.empty() ? 0 : gate_rows[i];  // the output gate's rows, last (Qwen3.5)
    at::Tensor output_gate;
    if (gate) {
      output_gate = qkv.narrow(1, qkv.size(1) - gate, gate);
      qkv = qkv.narrow(1, 0, qkv.size(1) - gate).contiguous();
    }
    if (!v_from_k.empty() && v_from_k[i]) {  // V is K's projection, before K's norm and RoPE
      qkv = at::cat({qkv, qkv.narrow(1, num_heads * head_dim, (qkv.size(1) / head_dim - num_heads) * head_dim)}, 1);
    }
    const at::Tensor heads = qkv.view({tokens, -1, head_dim});
    const int64_t kv_heads = (heads.size(1) - num_heads) / 2;  // 0 where q alone
    if (qk_norm) qk_rms_norm.call(qkv, norms[n + 2], norms[n + 3], num_heads, kv_heads, eps);  // the layer-by-layer op
    if (v_norm && kv_heads) {  // each V head, without a scale (as torch's rms_norm on the layer-by-layer path)
      at::Tensor part = heads.narrow(1, num_heads + kv_heads, kv_heads);
      part.copy_(at::rms_norm(part.reshape({-1, head_dim}).contiguous(), {head_dim}, c10::nullopt, eps).view(part.sizes()));
    }
    const int64_t window = windows.empty() ? 0 : windows[i];
    const bool local = window > 0 && local_cos.has_value();
    const bool own_pools = window > 0 && window_slots.has_value();
    const at::Tensor& layer_cos = local ? *local_cos : cos;
    const at::Tensor& layer_sin = local ? *local_sin : signed_sin;
    at::Tensor q;
    if (own_kv) {
      rope_write_kv.call(qkv, positions, layer_cos, layer_sin, k_cache, v_cache, own_pools ? *window_slots : slots,
                         num_heads);
      q = heads.narrow(1, 0, num_heads);
    } else {  // q alone over its source's pools (this step's K/V already in them): apply_rope's four ops
      const at::Tensor c = layer_cos.index({positions}).unsqueeze(1), s = layer_sin.index({positions}).unsqueeze(1);
      q = (heads * c).add_(heads.roll({head_dim / 2}, {-1}).mul_(s));
    }
    const std::optional<at::Tensor> layer_sinks =
        sinks.empty() || !sinks[i].numel() ? std::nullopt : std::optional<at::Tensor>(sinks[i]);
    at::Tensor attn = (window > 0 || layer_sinks ? paged_attention.call(q, k_cache, v_cache, own_pools ? *window_tables : block_tables,
                                                                        starts, lengths, scale, c10::nullopt, window, layer_sinks)
                                                 : paged_decode.call(q, k_cache, v_cache, block_tables, lengths, scale))
                          .view({tokens, -1});
    if (gate) attn = attn * at::sigmoid(output_gate).view_as(attn);
    return plus_bias(linear(attn, w + 2), 2 * i + 1);
  };
  // a Gated DeltaNet layer (models/delta_net.py) on its normed rows h: its four input projections (slots 0, 1, 5 and
  // 6: in_proj_qkv, z, b, a), the step in one call on its conv and state pools (its K and V pools' places), out_proj
  auto delta_net = [&](const at::Tensor& h, int64_t i, int64_t w) {
    at::Tensor conv_pool = k_caches[i], state_pool = v_caches[i];
    const at::Tensor gated = delta_net_step.call(conv_pool, state_pool, *state_slots, linear(h, w), linear(h, w + 5),
                                                 linear(h, w + 6), linear(h, w + 1), delta_parts[5 * i],
                                                 delta_parts[5 * i + 1], delta_parts[5 * i + 2], delta_parts[5 * i + 3],
                                                 delta_parts[5 * i + 4], key_heads, eps);
    return linear(gated, w + 2);
  };

  for (int64_t i = 0; i < layers; i++) {
    const int64_t n = per_layer * i, w = stride * i;  // this layer's first norm and first weight
    at::Tensor h = delta ? add_rms_norm.call(x, *delta, norms[n], eps) : rms_norm.call(x, norms[n], eps);
    at::Tensor out = is_delta_net(i) ? delta_net(h, i, w) : attend(h, i, n, w);
    if (sandwich) out = rms_norm.call(out, norms[n + attention_norms], eps);
    h = add_rms_norm.call(x, out, norms[n + 1], eps);
    auto dense_mlp = [&] { return linear(glu.call(linear(h, w + 3)), w + 4); };
    if (routers.empty()) {
      delta = dense_mlp();
    } else if (!dense_beside_experts) {
      delta = experts(h, i, h);
      if (!shared_gates.empty()) delta = *delta + row_gate(h, shared_gates[i]) * dense_mlp();  // the shared expert
    } else {  // the router on the stream's plain RMSNorm (torch's, as the layer-by-layer path), the experts on theirs
      const at::Tensor routed = at::rms_norm(x.to(at::kFloat), {x.size(1)}, c10::nullopt, eps).to(x.scalar_type());
      const at::Tensor dense = dense_mlp(), routed_out = experts(rms_norm.call(x, norms[n + moe_norms], eps), i, routed);
      delta = rms_norm.call(dense, norms[n + moe_norms + 1], eps).add_(rms_norm.call(routed_out, norms[n + moe_norms + 2], eps));
    }
    if (sandwich) delta = rms_norm.call(*delta, norms[n + attention_norms + 1], eps);
    if (gated_inputs || !scalars.empty()) {  // the stream takes the MLP's output here, not in the next norm
      x.add_(*delta);
      delta.reset();
    }
    if (gated_inputs) {  // the layer's own input, gated by the stream into it
      at::Tensor gated = at::gelu(linear(x, w + 5), "tanh");
      gated.mul_((*per_layer_inputs)[i]);
      x.add_(rms_norm.call(linear(gated, w + 6), norms[n + per_layer - 1], eps));
    }
    if (!scalars.empty()) x.mul_(scalars[i]);
  }
  if (delta) x.add_(*delta);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(inferplug, m) {
  m.def("decode_layers(Tensor(a!) x, Tensor[] norms, Tensor[] weights, int[] kinds, Tensor[] orders, "
        "Tensor[] k_caches, Tensor[] v_caches, Tensor positions, Tensor cos, Tensor signed_sin, Tensor slots, Tensor block_tables, "
        "Tensor lengths, int num_heads, float scale, float eps, Tensor[] routers, Tensor[] expert_tables, Tensor[] biases, "
        "Tensor[] sinks, Tensor[] expert_parts, Tensor[] delta_parts, Tensor[] shared_gates, "
        "int[] windows=[], Tensor? local_cos=None, "
        "Tensor? local_sin=None, bool sandwich=False, str activation='silu', Tensor? window_slots=None, "
        "Tensor? window_tables=None, int[] kv_sources=[], int[] v_from_k=[], bool v_norm=False, "
        "Tensor? per_layer_inputs=None, float[] scalars=[], int[] expert_rows=[], int[] expert_kinds=[], "
        "int top_k=0, bool renormalize=False, bool dense_beside_experts=False, int[] gate_rows=[], Tensor? state_slots=None, "
        "int key_heads=0) -> ()");
}
TORCH_LIBRARY_IMPL(inferplug, CPU, m) { m.impl("decode_layers", &decode_layers); }
