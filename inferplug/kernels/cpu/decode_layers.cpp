// Every decoder layer of a decode step in one call, when the layers' weights are Q4_1 / Q4_G128 / Q4_K / Q8_0 blocks: the
// same kernels, in the same order, as LlamaModel.forward calls them one by one from Python, so the result
// is bit for bit the same. At one token a step the Python between ~300 kernel calls cost about as much
// as the layers' arithmetic.
// GPTQ act-order weights (desc_act) have their input columns permuted at load; the matmul gathers their inputs in
// the same order as it quantizes them (quant/checkpoint_layers.py's PermutedLinear uses index_select on the
// layer-by-layer path).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <optional>

namespace {

template <typename Signature>
c10::TypedOperatorHandle<Signature> op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

using Matmul = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&);

// x: the step's hidden states [T, hidden], one row per sequence, updated in place to the last layer's
// residual stream. Per layer i: norms[2i], norms[2i+1] (input and post-attention RMSNorm weights);
// weights[5i..5i+4] (qkv, a second qkv part, o, gate_up, down blocks) with kinds[5i..5i+4] (4: Q4_1, 5: Q4_K,
// 6: Q4_G128, 7: Q6_K, 8: Q8_0, 9: Q5_K; 0 for no second qkv part: its weight is then unused) and orders[5i..5i+4] (an act-order
// weight's input permutation, empty for a weight whose inputs are in order). A second qkv part is the next output
// rows in another format (quant/checkpoint_layers.py RowPartsLinear: a Q4_K_M's Q6_K attn_v beside Q4_K q/k); its K/V pools
// (float32 or float16: rope_write_kv_ and paged_decode take either).
// Ends with x plus the last layer's MLP output in x (LlamaModel.forward's result).
void decode_layers(at::Tensor& x, at::TensorList norms, at::TensorList weights, at::IntArrayRef kinds,
                   at::TensorList orders, at::TensorList k_caches, at::TensorList v_caches, const at::Tensor& positions,
                   const at::Tensor& cos, const at::Tensor& signed_sin, const at::Tensor& slots, const at::Tensor& block_tables,
                   const at::Tensor& lengths, int64_t num_heads, double scale, double eps) {
  const int64_t layers = static_cast<int64_t>(k_caches.size());
  TORCH_CHECK(layers > 0 && v_caches.size() == k_caches.size() && norms.size() == 2 * k_caches.size() &&
              weights.size() == 5 * k_caches.size() && kinds.size() == weights.size() && orders.size() == weights.size(),
              "decode_layers: per layer, 2 norms, 5 weights with their kinds and input orders and a K and a V pool");
  static const auto q4 = op<Matmul>("inferplug::q4_matmul"), q4_k = op<Matmul>("inferplug::q4_k_matmul"),
                    q4_g128 = op<Matmul>("inferplug::q4_g128_matmul"), q6_k = op<Matmul>("inferplug::q6_k_matmul"),
                    q8 = op<Matmul>("inferplug::q8_matmul"), q5_k = op<Matmul>("inferplug::q5_k_matmul");
  static const auto rms_norm = op<at::Tensor(const at::Tensor&, const at::Tensor&, double)>("inferplug::rms_norm");
  static const auto add_rms_norm = op<at::Tensor(at::Tensor&, const at::Tensor&, const at::Tensor&, double)>("inferplug::add_rms_norm_");
  static const auto rope_write_kv = op<void(at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, at::Tensor&,
                                            at::Tensor&, const at::Tensor&, int64_t)>("inferplug::rope_write_kv_");
  static const auto paged_decode = op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                 const at::Tensor&, double)>("inferplug::paged_decode");
  static const auto silu_mul = op<at::Tensor(const at::Tensor&)>("inferplug::silu_mul");
  auto linear = [&](const at::Tensor& in, int64_t w) {
    TORCH_CHECK(kinds[w] >= 4 && kinds[w] <= 9,
                "decode_layers: weight kind must be 4 (Q4_1), 5 (Q4_K), 6 (Q4_G128), 7 (Q6_K), 8 (Q8_0) or 9 (Q5_K), got ", kinds[w]);
    // an act-order weight's inputs are gathered as the matmul quantizes them
    const std::optional<at::Tensor> order = orders[w].numel() ? std::optional<at::Tensor>(orders[w]) : std::nullopt;
    const auto& matmul = kinds[w] == 4 ? q4 : kinds[w] == 5 ? q4_k : kinds[w] == 6 ? q4_g128 : kinds[w] == 7 ? q6_k
                         : kinds[w] == 8 ? q8 : q5_k;
    return matmul.call(in, weights[w], order);
  };

  const int64_t tokens = x.size(0), head_dim = k_caches[0].size(3);
  std::optional<at::Tensor> delta;
  for (int64_t i = 0; i < layers; i++) {
    at::Tensor k_cache = k_caches[i], v_cache = v_caches[i];
    at::Tensor h = delta ? add_rms_norm.call(x, *delta, norms[2 * i], eps) : rms_norm.call(x, norms[2 * i], eps);
    at::Tensor qkv = kinds[5 * i + 1] ? at::cat({linear(h, 5 * i), linear(h, 5 * i + 1)}, 1) : linear(h, 5 * i);
    rope_write_kv.call(qkv, positions, cos, signed_sin, k_cache, v_cache, slots, num_heads);
    const at::Tensor q = qkv.view({tokens, -1, head_dim}).narrow(1, 0, num_heads);
    const at::Tensor attn = paged_decode.call(q, k_cache, v_cache, block_tables, lengths, scale).view({tokens, -1});
    h = add_rms_norm.call(x, linear(attn, 5 * i + 2), norms[2 * i + 1], eps);
    delta = linear(silu_mul.call(linear(h, 5 * i + 3)), 5 * i + 4);
  }
  if (delta) x.add_(*delta);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(inferplug, m) {
  m.def("decode_layers(Tensor(a!) x, Tensor[] norms, Tensor[] weights, int[] kinds, Tensor[] orders, "
        "Tensor[] k_caches, Tensor[] v_caches, Tensor positions, Tensor cos, Tensor signed_sin, Tensor slots, Tensor block_tables, "
        "Tensor lengths, int num_heads, float scale, float eps) -> ()");
}
TORCH_LIBRARY_IMPL(inferplug, CPU, m) { m.impl("decode_layers", &decode_layers); }
