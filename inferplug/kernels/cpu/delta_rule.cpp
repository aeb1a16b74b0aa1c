// One decode step of the gated delta rule (Gated DeltaNet, models/delta_net.py) for every decode row, in place on
// the rows' state slots: per (row, value head) the state S [key dim, value dim] is read twice and written once,
// where the torch ops made seven passes over it and its temporaries (42% of a Qwen3.5-9B 8-stream decode step).
//   S' = exp(g) S + k (beta (v - exp(g) S^T k))^T,   out = S'^T q
// Each (row, head) is one work item with one fixed order of sums (over the key dim, lane by lane of the value
// dim), so a row's state and output do not depend on the step's other rows.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>

#include "checks.h"

namespace {

constexpr int64_t MAX_VALUE_DIM = 512;  // a head's value width the stack scratch holds

void step_head(float* state, const float* q, const float* k, const float* v, float decay, float beta, float* out,
               int64_t key_dim, int64_t value_dim) {
  float delta[MAX_VALUE_DIM];
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
                  beta.numel() == rows * heads && value_dim <= MAX_VALUE_DIM,
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

}  // namespace

TORCH_LIBRARY_FRAGMENT(inferplug, m) {
  m.def("delta_rule_step_(Tensor(a!) state_pool, Tensor slots, Tensor q, Tensor k, Tensor v, Tensor g, "
        "Tensor beta) -> Tensor");
}
TORCH_LIBRARY_IMPL(inferplug, CPU, m) { m.impl("delta_rule_step_", &delta_rule_step_); }
