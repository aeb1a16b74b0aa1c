// An MoE layer's experts in one call (models/moe.py): the (row, choice) pairs grouped expert by expert, each selected
// expert's weights read once for all the pairs that chose it, gate/up, SiLU-GLU, down, and each row's k outputs
// weighted and summed in ascending expert order. A per-expert loop of matmul ops costs 2 x top-k thread-pool
// barriers a layer and more in dispatch than in arithmetic at one token (ONNX Runtime's PR 32668 measured the same);
// here a layer takes six parallel regions whatever k is.
//
// Every pair's row runs the arithmetic the dense block layers give it (quant_matmul.cpp's kernels: int8 decode rows,
// float32 / bf16 prefill rows) and the sum goes in one order, so the result equals the per-expert loop's bit for bit
// and a row's output does not depend on which rows share its experts.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "checks.h"
#include "glu.h"
#include "kernels.h"
#include "matmul_input.h"
#include "prefill_gemm.h"
#include "quant_dot.h"

namespace {

template <typename T>
struct Tag {
  using type = T;
};

// f(Tag<Format>) for a format's name: the block layers' kernel prefix (quant/block_linear.py).
template <typename F>
void with_format(const std::string& name, const F& f) {
  if (name == "q4") f(Tag<Q4_1>{});
  else if (name == "q4_g128") f(Tag<Q4_G128>{});
  else if (name == "q4_k") f(Tag<Q4_K>{});
  else if (name == "q5_0") f(Tag<Q5_0>{});
  else if (name == "q5_k") f(Tag<Q5_K>{});
  else if (name == "q6_k") f(Tag<Q6_K>{});
  else if (name == "q8") f(Tag<Q8_0>{});
  else if (name == "mxfp4") f(Tag<MXFP4>{});
  else TORCH_CHECK(false, "moe_experts: unknown block format '", name, "' (q4, q4_g128, q4_k, q5_0, q5_k, q6_k, q8 or mxfp4)");
}

// The pairs laid out expert by expert (a row's choices in its own order within an expert).
struct Groups {
  std::vector<int64_t> experts;  // the selected experts, ascending
  std::vector<int64_t> offsets;  // expert experts[i]'s pairs sit at [offsets[i], offsets[i + 1])
  std::vector<int64_t> row;      // each pair's row of x
  std::vector<int64_t> pair;     // each (row, choice)'s place among the pairs
};

Groups group_by_expert(const int64_t* chosen, int64_t rows, int64_t k, int64_t num_experts) {
  std::vector<int64_t> count(num_experts, 0);
  for (int64_t i = 0; i < rows * k; i++) {
    TORCH_CHECK(chosen[i] >= 0 && chosen[i] < num_experts, "moe_experts: expert ", chosen[i], " is outside 0..",
                num_experts - 1);
    count[chosen[i]]++;
  }
  Groups g;
  std::vector<int64_t> next(num_experts);
  g.offsets.push_back(0);
  for (int64_t e = 0; e < num_experts; e++) {
    next[e] = g.offsets.back();
    if (count[e] == 0) continue;
    g.experts.push_back(e);
    g.offsets.push_back(g.offsets.back() + count[e]);
  }
  g.row.resize(rows * k);
  g.pair.resize(rows * k);
  for (int64_t i = 0; i < rows * k; i++) {
    g.pair[i] = next[chosen[i]]++;
    g.row[g.pair[i]] = i / k;
  }
  return g;
}

// x's quantized rows (row-major, as pair_input quantizes them) copied into pair order: quantized once a row, shared
// by every expert it chose.
QuantizedX gather(const QuantizedX& x, const std::vector<int64_t>& rows) {
  TORCH_CHECK(!x.by_runs, "moe_experts: gather takes row-major x");
  const int64_t width = x.blocks, n = static_cast<int64_t>(rows.size());
  QuantizedX out = QuantizedX::zeros(width, n, false);
  for (int64_t p = 0; p < n; p++) {
    const int64_t from = rows[p] * width, to = p * width;
    std::copy_n(x.q.begin() + from * QK, width * QK, out.q.begin() + to * QK);
    std::copy_n(x.scale.begin() + from, width, out.scale.begin() + to);
    std::copy_n(x.sum.begin() + from, width, out.sum.begin() + to);
    std::copy_n(x.qsum.begin() + from, width, out.qsum.begin() + to);
    std::copy_n(x.q6_low.begin() + from, width, out.q6_low.begin() + to);
    std::copy_n(x.q6_high.begin() + from, width, out.q6_high.begin() + to);
  }
  return out;
}

// One projection's experts: an int64 table of the addresses of their rows of blocks, which the caller keeps alive
// (models/moe.py's MoeWeights holds the layers and checks their shapes when it makes the table).
std::vector<const uint8_t*> expert_rows(const at::Tensor& table, int64_t experts, const char* name) {
  TORCH_CHECK(table.dim() == 1 && table.scalar_type() == at::kLong && table.is_contiguous() && table.size(0) == experts,
              "moe_experts: ", name, " must be a contiguous int64 table of ", experts, " experts' block addresses");
  const int64_t* addresses = table.data_ptr<int64_t>();
  std::vector<const uint8_t*> rows;
  for (int64_t e = 0; e < experts; e++) rows.push_back(reinterpret_cast<const uint8_t*>(addresses[e]));
  return rows;
}

// A projection's input in pair order: quantized once a row (precision "int8") or float32 [pairs, K].
struct PairInput {
  QuantizedX q;
  at::Tensor f;
};

// rows: x's row for each pair (gate_up's input: a row quantized once, shared by every expert it chose), or null
// where x is in pair order already (down's).
PairInput pair_input(const at::Tensor& x, const std::vector<int64_t>* rows, const std::string& precision) {
  if (precision != "int8") return {{}, rows ? x.index_select(0, at::tensor(*rows, x.options().dtype(at::kLong))) : x};
  QuantizedX q = quantize_rows(x.data_ptr<float>(), x.size(0), x.size(1), nullptr, false);  // row-major (kernels.h)
  return {rows ? gather(q, *rows) : std::move(q), {}};
}

// y [pairs, N] = each pair's input row @ its expert's weight.T, every selected expert in one parallel region: work
// items are (a tile of weight rows, expert), each passing all of that expert's pairs over its tile.
template <typename Format>
at::Tensor grouped_matmul(const Groups& g, const std::vector<const uint8_t*>& weights, int64_t N, int64_t K,
                          const PairInput& x, const std::string& precision, const at::TensorOptions& options) {
  const int64_t pairs = g.offsets.back(), blocks = K / QK, row_bytes = RowLayout<Format>::bytes(blocks);
  at::Tensor y = at::empty({pairs, N}, options);
  float* out = y.data_ptr<float>();
  const auto& isa = inferplug_isa::active();
  const bool int8 = precision == "int8";
  const int64_t tile = int8 ? 16 : prefill_cols(N), tiles = (N + tile - 1) / tile;  // 16: over_tiles' tile
  // Each thread takes a run of tiles of every expert (parallel_for's even split of the items, chunk by chunk):
  // balanced however the pairs spread over the experts, and each run streams its weight rows in order.
  const int64_t experts = static_cast<int64_t>(g.experts.size()), chunks = at::get_num_threads();
  const int64_t run = (tiles + chunks - 1) / chunks, items = chunks * experts * run;
  const auto item = [&](int64_t i) {  // item i's expert and first weight row (N: past the last tile, nothing to do)
    const int64_t chunk = i / (experts * run), in_chunk = i % (experts * run);
    return std::make_pair(in_chunk / run, std::min(N, (chunk * run + in_chunk % run) * tile));
  };
  if (int8) {
    const auto kernel = for_format<Format>(isa.quant);
    const auto xq = x.q.view();
    at::parallel_for(0, items, 1, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; i++) {
        const auto [e, n0] = item(i);
        if (n0 == N) continue;
        const int64_t n1 = std::min(N, n0 + tile);
        const inferplug_isa::WeightRows w{weights[g.experts[e]], row_bytes, blocks};
        for (int64_t m = g.offsets[e]; m < g.offsets[e + 1]; m += inferplug_isa::MAX_ROWS) {
          const int64_t rows = std::min(inferplug_isa::MAX_ROWS, g.offsets[e + 1] - m);
          kernel(w, n0, n1, xq, m, rows, out + m * N + n0, N);
        }
      }
    });
    return y;
  }
  const auto& kernels = precision == "bfloat16" ? isa.prefill_bfloat16 : isa.prefill_float32;
  const auto kernel = for_format<Format>(kernels);
  const at::Tensor input = prefill_input(x.f, kernels.input);
  const auto* xs = static_cast<const char*>(input.data_ptr());
  at::parallel_for(0, items, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; i++) {
      const auto [e, n0] = item(i);
      const int64_t m = g.offsets[e];
      if (n0 == N) continue;
      const inferplug_isa::WeightRows w{weights[g.experts[e]], row_bytes, blocks};
      kernel(w, n0, std::min(N, n0 + tile), xs + m * K * input.element_size(), g.offsets[e + 1] - m, out + m * N + n0, N);
    }
  });
  return y;
}

// y[p] += bias[the expert of pair p] for every pair (gpt-oss's experts' biases), as torch's out + bias.
void add_expert_bias(at::Tensor& y, const Groups& g, const c10::optional<at::Tensor>& bias, int64_t experts,
                     const char* name) {
  if (!bias) return;
  const int64_t n = y.size(1);
  TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->dim() == 2 && bias->size(0) == experts &&
                  bias->size(1) == n,
              "moe_experts: ", name, " must be contiguous float32 [", experts, " experts, ", n, "]");
  const float* b = bias->data_ptr<float>();
  float* out = y.data_ptr<float>();
  at::parallel_for(0, static_cast<int64_t>(g.experts.size()), 1, [&](int64_t e0, int64_t e1) {
    for (int64_t e = e0; e < e1; e++)
      for (int64_t p = g.offsets[e]; p < g.offsets[e + 1]; p++)
        for (int64_t i = 0; i < n; i++) out[p * n + i] = out[p * n + i] + b[g.experts[e] * n + i];
  });
}

// The MoE MLP of rows x [T, H]: chosen [T, k] experts with their router weights [T, k]; gate_up and down the tables
// of each expert's blocks, [2 * I, H / 32 blocks] (its gate rows, then its up rows) and [H, I / 32 blocks]. precision: "int8" (decode rows' kernels) or the prefill
// rows' "float32" / "bfloat16". gate_up_bias [E, 2 * I] and down_bias [E, H]: each expert's biases, or none;
// activation: "silu", gpt-oss's "swiglu_oai" or Gemma 4's "gelu_tanh" (glu.h).
at::Tensor moe_experts(const at::Tensor& x, const at::Tensor& chosen, const at::Tensor& router_weights,
                       const at::Tensor& gate_up, const at::Tensor& down, int64_t gate_up_rows,
                       const std::string& gate_up_format, const std::string& down_format, const std::string& precision,
                       const c10::optional<at::Tensor>& gate_up_bias, const c10::optional<at::Tensor>& down_bias,
                       const std::string& activation) {
  const GluRow glu = glu_row(activation);
  checks::float_cpu(x, "moe_experts", "x");
  checks::float_cpu(router_weights, "moe_experts", "router_weights");
  TORCH_CHECK(precision == "int8" || precision == "float32" || precision == "bfloat16",
              "moe_experts: precision must be int8, float32 or bfloat16, got '", precision, "'");
  TORCH_CHECK(x.dim() == 2 && chosen.dim() == 2 && chosen.size(0) == x.size(0) && chosen.scalar_type() == at::kLong &&
                  chosen.is_contiguous() && router_weights.sizes() == chosen.sizes(),
              "moe_experts: chosen (int64) and router_weights must both be [rows, top_k] for x's rows");
  const int64_t T = x.size(0), H = x.size(1), k = chosen.size(1), N_up = gate_up_rows, I = N_up / 2, E = gate_up.size(0);
  TORCH_CHECK(H % QK == 0 && I % QK == 0 && N_up % 2 == 0, "moe_experts: the widths must be multiples of 32");
  at::Tensor out = at::zeros({T, H}, x.options());
  if (T == 0) return out;
  const Groups g = group_by_expert(chosen.data_ptr<int64_t>(), T, k, E);
  at::Tensor up;
  with_format(gate_up_format, [&](auto tag) {
    using Format = typename decltype(tag)::type;
    up = grouped_matmul<Format>(g, expert_rows(gate_up, E, "gate_up"), N_up, H,
                                pair_input(x, &g.row, precision), precision, x.options());
  });
  add_expert_bias(up, g, gate_up_bias, E, "gate_up_bias");
  const int64_t pairs = T * k;
  at::Tensor hidden = at::empty({pairs, I}, x.options());
  const float* u = up.data_ptr<float>();
  float* h = hidden.data_ptr<float>();
  at::parallel_for(0, pairs, 8, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; p++) glu(u + p * N_up, u + p * N_up + I, h + p * I, I);
  });
  at::Tensor y;
  with_format(down_format, [&](auto tag) {
    using Format = typename decltype(tag)::type;
    y = grouped_matmul<Format>(g, expert_rows(down, E, "down"), H, I, pair_input(hidden, nullptr, precision),
                               precision, x.options());
  });
  add_expert_bias(y, g, down_bias, E, "down_bias");
  // Each row's outputs weighted and added in ascending expert order, each product rounded before its sum (as
  // torch's y * w and index_add_ in the per-expert loop; -ffp-contract=off keeps the compiler from fusing them).
  const int64_t* c = chosen.data_ptr<int64_t>();
  const float* rw = router_weights.data_ptr<float>();
  const float* ys = y.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, T, 1, [&](int64_t t0, int64_t t1) {
    std::vector<int64_t> order(k);
    for (int64_t t = t0; t < t1; t++) {
      for (int64_t j = 0; j < k; j++) order[j] = j;
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return c[t * k + a] < c[t * k + b]; });
      float* row = o + t * H;
      for (const int64_t j : order) {
        const float w = rw[t * k + j];
        const float* from = ys + g.pair[t * k + j] * H;
        for (int64_t i = 0; i < H; i++) row[i] = row[i] + from[i] * w;
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(inferplug, m) {
  m.def("moe_experts(Tensor x, Tensor chosen, Tensor router_weights, Tensor gate_up, Tensor down, "
        "int gate_up_rows, str gate_up_format, str down_format, str precision, Tensor? gate_up_bias=None, "
        "Tensor? down_bias=None, str activation='silu') -> Tensor");
}
TORCH_LIBRARY_IMPL(inferplug, CPU, m) { m.impl("moe_experts", &moe_experts); }
