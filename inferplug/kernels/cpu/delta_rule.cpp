// A DeltaNet layer's rows (Gated DeltaNet, models/delta_net.py), in place on each sequence's state slot.
//
// delta_rule_step_: one step of the gated delta rule for every decode row: per (row, value head) the state S
// [key dim, value dim] is read twice and written once, where the torch ops made seven passes over it and its
// temporaries (42% of a Qwen3.5-9B 8-stream decode step).
//   S' = exp(g) S + k (beta (v - exp(g) S^T k))^T,   out = S'^T q
// delta_net_step_: the whole step between the layer's input projections and its output projection (the causal
// conv with its window, q and k L2-normed, beta and the decay, the rule, the gated RMSNorm) in one call, where
// the torch ops around delta_rule_step_ took 280 us a layer at one row of Qwen3.5-35B-A3B's geometry (this call 90;
// Zen 4, 2 threads).
// chunked_delta_rule_: a sequence's prompt rows through the chunked (WY) form, a value head a work item
// (delta_chunks.h, per ISA), where the torch ops of kernels/delta_rule_ref.py took 140-210 us a token a layer at
// Qwen3.5-9B's 32 heads of 128. delta_net_prompt_: a sequence's prompt rows from the projections to the gated norm
// around it, as delta_net_step_ does for decode rows (the torch ops around the rule: about 2.5% of a prefill).
// Each decode (row, head) is one work item with one fixed order of sums (over the key dim, lane by lane of the value
// dim), so a row's state and output do not depend on the step's other rows.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>
#include <vector>

#include "checks.h"
#include "kernels.h"

namespace {

constexpr int64_t MAX_HEAD_DIM = 512;  // a head's key or value width the stack scratch holds

void step_head(float* state, const float* q, const float* k, const float* v, float decay, float beta, float* out,
               int64_t key_dim, int64_t value_dim) {
  float delta[MAX_HEAD_DIM];
#pragma omp simd
  for (int64_t j = 0; j < value_dim; j++) delta[j] = 0.f;
  for (int64_t i = 0; i < key_dim; i++) {  // S^T k
    const float* row = state + i * value_dim;
    const float ki = k[i];
#pragma omp simd
    for (int64_t j = 0; j < value_dim; j++) delta[j] += row[j] * ki;
  }
#pragma omp simd
  for (int64_t j = 0; j < value_dim; j++) {
    delta[j] = (v[j] - decay * delta[j]) * beta;
    out[j] = 0.f;
  }
  for (int64_t i = 0; i < key_dim; i++) {  // S' = decay S + k delta^T, and S'^T q
    float* row = state + i * value_dim;
    const float ki = k[i], qi = q[i];
#pragma omp simd
    for (int64_t j = 0; j < value_dim; j++) {
      row[j] = decay * row[j] + ki * delta[j];
      out[j] += row[j] * qi;
    }
  }
}

// state_pool [slots, heads, key dim, value dim]; slots [B]; q, k [B, heads, key dim] (k L2-normed, q normed and
// scaled); v [B, heads, value dim]; g (the log of the decay) and beta [B, heads]. Returns [B, heads, value dim].
at::Tensor delta_rule_step_(at::Tensor& state_pool, const at::Tensor& slots, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& g, const at::Tensor& beta) {
  const char* op = "delta_rule_step_";
  checks::float_cpu(state_pool, op, "state_pool"), checks::float_cpu(q, op, "q"), checks::float_cpu(k, op, "k");
  checks::float_cpu(v, op, "v"), checks::float_cpu(g, op, "g"), checks::float_cpu(beta, op, "beta");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.is_contiguous(), op, ": slots must be contiguous int64");
  TORCH_CHECK(state_pool.dim() == 4 && q.dim() == 3 && q.sizes() == k.sizes(), op, ": bad shapes");
  const int64_t rows = q.size(0), heads = state_pool.size(1), key_dim = state_pool.size(2),
                value_dim = state_pool.size(3);
  TORCH_CHECK(slots.numel() == rows && q.size(1) == heads && q.size(2) == key_dim && v.size(0) == rows &&
                  v.size(1) == heads && v.size(2) == value_dim && g.numel() == rows * heads &&
                  beta.numel() == rows * heads && value_dim <= MAX_HEAD_DIM,
              op, ": shapes do not match the state pool's");
  at::Tensor out = at::empty({rows, heads, value_dim}, v.options());
  const int64_t* slot = slots.data_ptr<int64_t>();
  const int64_t num_slots = state_pool.size(0);
  for (int64_t r = 0; r < rows; r++) TORCH_CHECK(slot[r] >= 0 && slot[r] < num_slots, op, ": a slot is out of range");
  float* pool = state_pool.data_ptr<float>();
  const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  const float *gp = g.data_ptr<float>(), *bp = beta.data_ptr<float>();
  float* op_out = out.data_ptr<float>();
  at::parallel_for(0, rows * heads, 1, [&](int64_t first, int64_t last) {
    for (int64_t item = first; item < last; item++) {
      const int64_t r = item / heads, h = item % heads;
      step_head(pool + (slot[r] * heads + h) * key_dim * value_dim, qp + item * key_dim, kp + item * key_dim,
                vp + item * value_dim, std::exp(gp[item]), bp[item], op_out + item * value_dim, key_dim, value_dim);
    }
  });
  return out;
}

inline float sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }
inline float softplus(float x) { return x > 20.f ? x : std::log1p(std::exp(x)); }  // torch's threshold

// The causal conv of one row's channels [c0, c1) with SiLU into x, its window (the last kernel - 1 inputs) shifted
// on by the row's input.
void conv_row(float* window, const float* input, const float* weight, int64_t channels, int64_t kernel, int64_t c0,
              int64_t c1, float* x) {
  for (int64_t c = c0; c < c1; c++) {
    const float* taps = weight + c * kernel;
    float sum = 0.f;
    for (int64_t t = 0; t + 1 < kernel; t++) sum += window[t * channels + c] * taps[t];
    sum += input[c] * taps[kernel - 1];
    x[c] = sum * sigmoid(sum);
    for (int64_t t = 0; t + 2 < kernel; t++) window[t * channels + c] = window[(t + 1) * channels + c];
    if (kernel > 1) window[(kernel - 2) * channels + c] = input[c];
  }
}

// v / sqrt(sum(v^2) + 1e-6) * scale into out: HF's l2norm of q and k.
void l2_normed(const float* v, int64_t n, float scale, float* out) {
  float sum = 0.f;
  for (int64_t i = 0; i < n; i++) sum += v[i] * v[i];
  const float inv = 1.f / std::sqrt(sum + 1e-6f);
#pragma omp simd
  for (int64_t i = 0; i < n; i++) out[i] = v[i] * inv * scale;
}

// The layer's constants (models/delta_net.py DeltaNetWeights), as one argument.
struct DeltaNetLayer {
  const float *conv, *dt_bias, *neg_a, *norm;
  const int64_t* key_of_value;
  int64_t key_heads, key_dim, value_heads, value_dim, kernel;
  float eps;
};

// A head's output o, RMS-normed, times the scale and silu(z), into out (out may be o).
void gated_norm(const DeltaNetLayer& l, const float* o, const float* z, float* out) {
  float squares = 0.f;
  for (int64_t j = 0; j < l.value_dim; j++) squares += o[j] * o[j];
  const float inv = 1.f / std::sqrt(squares / static_cast<float>(l.value_dim) + l.eps);
  for (int64_t j = 0; j < l.value_dim; j++) out[j] = o[j] * inv * l.norm[j] * (z[j] * sigmoid(z[j]));
}

// Key head kh's q and k from a row's conv output x: L2-normed, q times 1 / sqrt(key dim) (HF's scale).
void normed_qk(const DeltaNetLayer& l, const float* x, int64_t kh, float* q, float* k) {
  l2_normed(x + kh * l.key_dim, l.key_dim, 1.f / std::sqrt(static_cast<float>(l.key_dim)), q);
  l2_normed(x + l.key_heads * l.key_dim + kh * l.key_dim, l.key_dim, 1.f, k);
}

// The log of value head h's decay for a row's a: -exp(A_log) softplus(a + dt_bias).
float log_decay(const DeltaNetLayer& l, int64_t h, float a) { return l.neg_a[h] * softplus(a + l.dt_bias[h]); }

// Value head h of a row: its q and k (the head's key head's, normed), the rule on its state, and the gated norm
// norm(o) * weight * silu(z) into out.
void head_step(const DeltaNetLayer& l, const float* x, float a, float b, const float* z, float* state, int64_t h,
               float* out) {
  float q[MAX_HEAD_DIM], k[MAX_HEAD_DIM], o[MAX_HEAD_DIM];
  normed_qk(l, x, l.key_of_value[h], q, k);
  step_head(state, q, k, x + 2 * l.key_heads * l.key_dim + h * l.value_dim, std::exp(log_decay(l, h, a)), sigmoid(b),
            o, l.key_dim, l.value_dim);
  gated_norm(l, o, z, out);
}

// The chunked rule (delta_chunks.h, the ISA's) for each of `heads` value heads, a work item; head(h) gives its
// DeltaRuleHead, and each thread its scratch.
template <typename Head>
void rule_over_heads(int64_t heads, int64_t key_dim, int64_t value_dim, const Head& head) {
  const auto rule = inferplug_isa::active().delta_rule;
  at::parallel_for(0, heads, 1, [&](int64_t first, int64_t last) {
    std::vector<float> scratch(inferplug_isa::delta_rule_scratch(key_dim, value_dim));
    for (int64_t h = first; h < last; h++) rule(head(h), scratch.data());
  });
}

// The layer's constants and the pools' shapes, checked against one another and the projections' `rows` rows.
DeltaNetLayer layer_of(const char* op, const at::Tensor& conv_pool, const at::Tensor& state_pool, int64_t rows,
                       const at::Tensor& mixed, const at::Tensor& b, const at::Tensor& a, const at::Tensor& z,
                       const at::Tensor& conv, const at::Tensor& dt_bias, const at::Tensor& neg_a,
                       const at::Tensor& norm, const at::Tensor& key_of_value, int64_t key_heads, double eps) {
  using Named = std::pair<const at::Tensor*, const char*>;
  for (const auto& [t, name] : {Named{&conv_pool, "conv_pool"}, Named{&state_pool, "state_pool"},
                                Named{&mixed, "mixed"}, Named{&b, "b"}, Named{&a, "a"}, Named{&z, "z"}, Named{&conv, "conv"},
                                Named{&dt_bias, "dt_bias"}, Named{&neg_a, "neg_a"}, Named{&norm, "norm"}})
    checks::float_cpu(*t, op, name);
  TORCH_CHECK(key_of_value.scalar_type() == at::kLong && key_of_value.is_contiguous(), op,
              ": key_of_value must be contiguous int64");
  TORCH_CHECK(conv_pool.dim() == 3 && state_pool.dim() == 4 && mixed.dim() == 2 && conv.dim() == 2, op, ": bad shapes");
  const int64_t channels = mixed.size(1), value_heads = state_pool.size(1), key_dim = state_pool.size(2),
                value_dim = state_pool.size(3), kernel = conv.size(1);
  TORCH_CHECK(mixed.size(0) == rows && conv_pool.size(0) == state_pool.size(0) && conv_pool.size(1) == kernel - 1 &&
                  conv_pool.size(2) == channels && conv.size(0) == channels &&
                  channels == 2 * key_heads * key_dim + value_heads * value_dim && b.numel() == rows * value_heads &&
                  a.numel() == rows * value_heads && z.numel() == rows * value_heads * value_dim &&
                  dt_bias.numel() == value_heads && neg_a.numel() == value_heads && norm.numel() == value_dim &&
                  key_of_value.numel() == value_heads && key_dim <= MAX_HEAD_DIM && value_dim <= MAX_HEAD_DIM,
              op, ": shapes do not match the state pools'");
  const int64_t* kv = key_of_value.data_ptr<int64_t>();
  for (int64_t h = 0; h < value_heads; h++)
    TORCH_CHECK(kv[h] >= 0 && kv[h] < key_heads, op, ": a key head is out of range");
  return {conv.data_ptr<float>(), dt_bias.data_ptr<float>(), neg_a.data_ptr<float>(), norm.data_ptr<float>(), kv,
          key_heads, key_dim, value_heads, value_dim, kernel, static_cast<float>(eps)};
}

constexpr int64_t CONV_CHANNELS = 512;  // a conv work item's channels

// The chunk grid the caller (the scheduler, kernels/delta_rule_ref.py) cuts prompts on must be the kernel's, or a
// prompt's bits would depend on its steps.
void check_chunk(const char* op, int64_t chunk) {
  TORCH_CHECK(chunk == inferplug_isa::DELTA_CHUNK, op, ": the kernel's chunks are ", inferplug_isa::DELTA_CHUNK,
              " tokens, the caller's ", chunk);
}

// conv_pool [slots, kernel - 1, channels] and state_pool [slots, value heads, key dim, value dim]; slots [B]; the
// projections' rows: mixed [B, channels] (q, k, v), b and a [B, value heads], z [B, value heads * value dim].
// Returns the gated norm's rows [B, value heads * value dim], for the output projection.
at::Tensor delta_net_step_(at::Tensor& conv_pool, at::Tensor& state_pool, const at::Tensor& slots,
                           const at::Tensor& mixed, const at::Tensor& b, const at::Tensor& a, const at::Tensor& z,
                           const at::Tensor& conv, const at::Tensor& dt_bias, const at::Tensor& neg_a,
                           const at::Tensor& norm, const at::Tensor& key_of_value, int64_t key_heads, double eps) {
  const char* op = "delta_net_step_";
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.is_contiguous(), op, ": slots must be contiguous int64");
  const int64_t rows = slots.numel();
  const DeltaNetLayer layer = layer_of(op, conv_pool, state_pool, rows, mixed, b, a, z, conv, dt_bias, neg_a, norm,
                                       key_of_value, key_heads, eps);
  const int64_t channels = mixed.size(1), value_heads = layer.value_heads, key_dim = layer.key_dim,
                value_dim = layer.value_dim, kernel = layer.kernel;
  const int64_t* slot = slots.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; r++)
    TORCH_CHECK(slot[r] >= 0 && slot[r] < state_pool.size(0), op, ": a slot is out of range");
  at::Tensor x = at::empty({rows, channels}, mixed.options());
  at::Tensor out = at::empty({rows, value_heads * value_dim}, mixed.options());
  float *windows = conv_pool.data_ptr<float>(), *states = state_pool.data_ptr<float>(), *xs = x.data_ptr<float>();
  const float *in = mixed.data_ptr<float>(), *bs = b.data_ptr<float>(), *as = a.data_ptr<float>(),
              *zs = z.data_ptr<float>();
  const int64_t chunks = (channels + CONV_CHANNELS - 1) / CONV_CHANNELS;
  at::parallel_for(0, rows * chunks, 1, [&](int64_t first, int64_t last) {
    for (int64_t item = first; item < last; item++) {
      const int64_t r = item / chunks, c0 = item % chunks * CONV_CHANNELS;
      conv_row(windows + slot[r] * (kernel - 1) * channels, in + r * channels, layer.conv, channels, kernel, c0,
               std::min(channels, c0 + CONV_CHANNELS), xs + r * channels);
    }
  });
  float* outs = out.data_ptr<float>();
  at::parallel_for(0, rows * value_heads, 1, [&](int64_t first, int64_t last) {
    for (int64_t item = first; item < last; item++) {
      const int64_t r = item / value_heads, h = item % value_heads;
      head_step(layer, xs + r * channels, as[item], bs[item], zs + item * value_dim,
                states + (slot[r] * value_heads + h) * key_dim * value_dim, h, outs + item * value_dim);
    }
  });
  return out;
}

// One sequence's n prompt rows through the layer, from its projections (as delta_net_step_ takes them) to the gated
// norm, on state slot `slot` (fresh: from zero, as a new sequence starts): the causal conv row by row with its window
// (channel blocks in parallel), q and k L2-normed once a key head, beta and the decay, the chunked rule a value head
// a work item (delta_chunks.h), each row's gated norm. Every row's arithmetic is its own and the rule's chunks lie
// on the prompt's 64-token grid, so the bits do not depend on how the scheduler cut the prompt into steps.
// Returns the gated rows [n, value heads * value dim].
at::Tensor delta_net_prompt_(at::Tensor& conv_pool, at::Tensor& state_pool, int64_t slot, bool fresh,
                             const at::Tensor& mixed, const at::Tensor& b, const at::Tensor& a, const at::Tensor& z,
                             const at::Tensor& conv, const at::Tensor& dt_bias, const at::Tensor& neg_a,
                             const at::Tensor& norm, const at::Tensor& key_of_value, int64_t key_heads, double eps,
                             int64_t chunk) {
  const char* op = "delta_net_prompt_";
  check_chunk(op, chunk);
  TORCH_CHECK(mixed.dim() == 2, op, ": mixed must be [rows, channels]");
  const int64_t n = mixed.size(0);
  const DeltaNetLayer l = layer_of(op, conv_pool, state_pool, n, mixed, b, a, z, conv, dt_bias, neg_a, norm,
                                   key_of_value, key_heads, eps);
  TORCH_CHECK(slot >= 0 && slot < state_pool.size(0), op, ": the slot is out of range");
  const int64_t channels = mixed.size(1), heads = l.value_heads, K = l.key_dim, D = l.value_dim,
                keys = key_heads * K;
  float* window = conv_pool.data_ptr<float>() + slot * (l.kernel - 1) * channels;
  float* state = state_pool.data_ptr<float>() + slot * heads * K * D;
  if (fresh) {
    std::fill(window, window + (l.kernel - 1) * channels, 0.f);
    std::fill(state, state + heads * K * D, 0.f);
  }
  at::Tensor x = at::empty({n, channels}, mixed.options()), qk = at::empty({2, n, keys}, mixed.options());
  at::Tensor gates = at::empty({2, n, heads}, mixed.options()), out = at::empty({n, heads * D}, mixed.options());
  float *xs = x.data_ptr<float>(), *qs = qk.data_ptr<float>(), *ks = qs + n * keys, *gs = gates.data_ptr<float>();
  float *betas = gs + n * heads, *outs = out.data_ptr<float>();
  const float *in = mixed.data_ptr<float>(), *bs = b.data_ptr<float>(), *as = a.data_ptr<float>(),
              *zs = z.data_ptr<float>();
  at::parallel_for(0, (channels + CONV_CHANNELS - 1) / CONV_CHANNELS, 1, [&](int64_t first, int64_t last) {
    for (int64_t c0 = first * CONV_CHANNELS; c0 < std::min(channels, last * CONV_CHANNELS); c0 += CONV_CHANNELS)
      for (int64_t r = 0; r < n; r++)
        conv_row(window, in + r * channels, l.conv, channels, l.kernel, c0, std::min(channels, c0 + CONV_CHANNELS),
                 xs + r * channels);
  });
  at::parallel_for(0, n, 16, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; r++) {
      for (int64_t kh = 0; kh < key_heads; kh++)
        normed_qk(l, xs + r * channels, kh, qs + r * keys + kh * K, ks + r * keys + kh * K);
      for (int64_t h = 0; h < heads; h++) {
        gs[r * heads + h] = log_decay(l, h, as[r * heads + h]);
        betas[r * heads + h] = sigmoid(bs[r * heads + h]);
      }
    }
  });
  rule_over_heads(heads, K, D, [&](int64_t h) {
    const int64_t kh = l.key_of_value[h];
    return inferplug_isa::DeltaRuleHead{qs + kh * K, ks + kh * K, xs + 2 * keys + h * D, gs + h, betas + h, keys,
                                        channels, heads, state + h * K * D, outs + h * D, heads * D, n, K, D};
  });
  at::parallel_for(0, n * heads, 16, [&](int64_t first, int64_t last) {
    for (int64_t item = first; item < last; item++) gated_norm(l, outs + item * D, zs + item * D, outs + item * D);
  });
  return out;
}

// q, k [n, heads, key dim] (q scaled, both L2-normed), v [n, heads, value dim], g (<= 0) and beta [n, heads] from
// `state` [heads, key dim, value dim]; `chunk`: the caller's chunk grid, which must be the kernel's. Returns the
// outputs [n, heads, value dim] and the state after the rows.
std::tuple<at::Tensor, at::Tensor> chunked_delta_rule_(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                       const at::Tensor& g, const at::Tensor& beta,
                                                       const at::Tensor& state, int64_t chunk) {
  const char* op = "chunked_delta_rule_";
  using Named = std::pair<const at::Tensor*, const char*>;
  for (const auto& [t, name] : {Named{&q, "q"}, Named{&k, "k"}, Named{&v, "v"}, Named{&g, "g"}, Named{&beta, "beta"},
                                Named{&state, "state"}})
    checks::float_cpu(*t, op, name);
  check_chunk(op, chunk);
  TORCH_CHECK(q.dim() == 3 && q.sizes() == k.sizes() && v.dim() == 3 && state.dim() == 3, op, ": bad shapes");
  const int64_t n = q.size(0), heads = q.size(1), key_dim = q.size(2), value_dim = v.size(2);
  TORCH_CHECK(v.size(0) == n && v.size(1) == heads && g.sizes() == at::IntArrayRef({n, heads}) &&
                  beta.sizes() == g.sizes() && state.size(0) == heads && state.size(1) == key_dim &&
                  state.size(2) == value_dim,
              op, ": shapes do not match q's and the state's");
  // the kernel takes exp(c_i - c_j) as at most 1, which a decay's log (<= 0) guarantees
  TORCH_CHECK(n == 0 || g.max().item<float>() <= 0.f, op, ": g is the log of a decay and must be <= 0");
  at::Tensor out = at::empty({n, heads, value_dim}, v.options());
  at::Tensor after = state.clone();
  const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  const float *gp = g.data_ptr<float>(), *bp = beta.data_ptr<float>();
  float *sp = after.data_ptr<float>(), *op_out = out.data_ptr<float>();
  rule_over_heads(heads, key_dim, value_dim, [&](int64_t h) {
    return inferplug_isa::DeltaRuleHead{qp + h * key_dim, kp + h * key_dim, vp + h * value_dim, gp + h, bp + h,
                                        heads * key_dim, heads * value_dim, heads, sp + h * key_dim * value_dim,
                                        op_out + h * value_dim, heads * value_dim, n, key_dim, value_dim};
  });
  return {out, after};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(inferplug, m) {
  m.def("delta_rule_step_(Tensor(a!) state_pool, Tensor slots, Tensor q, Tensor k, Tensor v, Tensor g, "
        "Tensor beta) -> Tensor");
  m.def("delta_net_step_(Tensor(a!) conv_pool, Tensor(b!) state_pool, Tensor slots, Tensor mixed, Tensor b, Tensor a, "
        "Tensor z, Tensor conv, Tensor dt_bias, Tensor neg_a, Tensor norm, Tensor key_of_value, int key_heads, "
        "float eps) -> Tensor");
  m.def("delta_net_prompt_(Tensor(a!) conv_pool, Tensor(b!) state_pool, int slot, bool fresh, Tensor mixed, Tensor b, "
        "Tensor a, Tensor z, Tensor conv, Tensor dt_bias, Tensor neg_a, Tensor norm, Tensor key_of_value, "
        "int key_heads, float eps, int chunk) -> Tensor");
  m.def("chunked_delta_rule_(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, Tensor state, int chunk) -> "
        "(Tensor, Tensor)");
}
TORCH_LIBRARY_IMPL(inferplug, CPU, m) {
  m.impl("delta_rule_step_", &delta_rule_step_);
  m.impl("delta_net_step_", &delta_net_step_);
  m.impl("delta_net_prompt_", &delta_net_prompt_);
  m.impl("chunked_delta_rule_", &chunked_delta_rule_);
}
