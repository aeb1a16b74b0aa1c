// RMSNorm for float32 rows, optionally adding the residual branch first: one op where torch's fused
// rms_norm still dispatches ~8 (pow, mean, rsqrt, dtype copies), which at one token a step costs more
// than the arithmetic. And QK-norm in place on a qkv projection's q and k heads (qk_rms_norm_): one op where the
// torch ops copied each part out and back (24 us a layer at one row of Qwen3-30B-A3B, this op 5; Zen 4).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <optional>

#include "checks.h"

namespace {

// o = row / rms(row) * weight, with row += delta first when delta is given (in place); o may be row.
void normalize_row(float* row, const float* delta, const float* weight, float* o, int64_t width, double eps) {
  float squares = 0.f;
  if (delta != nullptr) {
#pragma omp simd
    for (int64_t i = 0; i < width; i++) row[i] += delta[i];
  }
#pragma omp simd reduction(+ : squares)
  for (int64_t i = 0; i < width; i++) squares += row[i] * row[i];
  const float inv = 1.f / std::sqrt(squares / static_cast<float>(width) + static_cast<float>(eps));
#pragma omp simd
  for (int64_t i = 0; i < width; i++) o[i] = row[i] * inv * weight[i];
}

// out[t] = x[t] / rms(x[t]) * weight, with x[t] += delta[t] first when delta is given (in place).
void normalize(float* x, const float* delta, const float* weight, float* out, int64_t rows, int64_t width, double eps) {
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++)
      normalize_row(x + r * width, delta ? delta + r * width : nullptr, weight, out + r * width, width, eps);
  });
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  checks::float_cpu(x, "rms_norm", "x"), checks::float_cpu(weight, "rms_norm", "weight");
  const int64_t width = weight.numel();
  TORCH_CHECK(x.size(-1) == width, "rms_norm: x's last dim must match the weight");
  at::Tensor out = at::empty_like(x);
  normalize(x.data_ptr<float>(), nullptr, weight.data_ptr<float>(), out.data_ptr<float>(), x.numel() / width, width, eps);
  return out;
}

at::Tensor add_rms_norm_(at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight, double eps) {
  checks::float_cpu(x, "rms_norm", "x"), checks::float_cpu(delta, "rms_norm", "delta");
  checks::float_cpu(weight, "rms_norm", "weight");
  const int64_t width = weight.numel();
  TORCH_CHECK(x.size(-1) == width && delta.sizes() == x.sizes(), "add_rms_norm_: x and delta must have the same shape, last dim the weight's");
  at::Tensor out = at::empty_like(x);
  normalize(x.data_ptr<float>(), delta.data_ptr<float>(), weight.data_ptr<float>(), out.data_ptr<float>(), x.numel() / width, width, eps);
  return out;
}

// qkv [T, (heads + 2 kv_heads) * head_dim] (or q alone where kv_heads is 0): each q head normed by q_norm and each k
// head by k_norm, in place, each head row as rms_norm's (the same bits as the parts copied out, normed and back).
void qk_rms_norm_(at::Tensor& qkv, const at::Tensor& q_norm, const std::optional<at::Tensor>& k_norm, int64_t num_heads,
                  int64_t kv_heads, double eps) {
  checks::float_cpu(qkv, "qk_rms_norm_", "qkv"), checks::float_cpu(q_norm, "qk_rms_norm_", "q_norm");
  const int64_t head_dim = q_norm.numel(), tokens = qkv.size(0), width = qkv.size(1);
  TORCH_CHECK(qkv.dim() == 2 && width % head_dim == 0 && width / head_dim >= num_heads + kv_heads &&
                  (kv_heads == 0 || (k_norm && k_norm->numel() == head_dim)),
              "qk_rms_norm_: qkv must be [T, heads * head_dim] with the q and k heads, and k_norm given where k is");
  if (kv_heads) checks::float_cpu(*k_norm, "qk_rms_norm_", "k_norm");
  const int64_t heads = num_heads + kv_heads;
  float* x = qkv.data_ptr<float>();
  const float *qw = q_norm.data_ptr<float>(), *kw = kv_heads ? k_norm->data_ptr<float>() : nullptr;
  at::parallel_for(0, tokens * heads, 16, [&](int64_t first, int64_t last) {
    for (int64_t item = first; item < last; item++) {
      const int64_t t = item / heads, h = item % heads;
      float* row = x + t * width + h * head_dim;
      normalize_row(row, nullptr, h < num_heads ? qw : kw, row, head_dim, eps);
    }
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(inferplug, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("add_rms_norm_(Tensor(a!) x, Tensor delta, Tensor weight, float eps) -> Tensor");
  m.def("qk_rms_norm_(Tensor(a!) qkv, Tensor q_norm, Tensor? k_norm, int num_heads, int kv_heads, float eps) -> ()");
}
TORCH_LIBRARY_IMPL(inferplug, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("add_rms_norm_", &add_rms_norm_);
  m.impl("qk_rms_norm_", &qk_rms_norm_);
}
