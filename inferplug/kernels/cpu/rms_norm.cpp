// RMSNorm for float32 rows, optionally adding the residual branch first: one op where torch's fused
// rms_norm still dispatches ~8 (pow, mean, rsqrt, dtype copies), which at one token a step costs more
// than the arithmetic.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>

#include "checks.h"

namespace {

// out[t] = x[t] / rms(x[t]) * weight, with x[t] += delta[t] first when delta is given (in place).
void normalize(float* x, const float* delta, const float* weight, float* out, int64_t rows, int64_t width, double eps) {
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
      float* row = x + r * width;
      float squares = 0.f;
      if (delta != nullptr) {
        const float* d = delta + r * width;
#pragma omp simd
        for (int64_t i = 0; i < width; i++) row[i] += d[i];
      }
#pragma omp simd reduction(+ : squares)
      for (int64_t i = 0; i < width; i++) squares += row[i] * row[i];
      const float inv = 1.f / std::sqrt(squares / static_cast<float>(width) + static_cast<float>(eps));
      float* o = out + r * width;
#pragma omp simd
      for (int64_t i = 0; i < width; i++) o[i] = row[i] * inv * weight[i];
    }
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

}  // namespace

TORCH_LIBRARY_FRAGMENT(inferplug, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("add_rms_norm_(Tensor(a!) x, Tensor delta, Tensor weight, float eps) -> Tensor");
}
TORCH_LIBRARY_IMPL(inferplug, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("add_rms_norm_", &add_rms_norm_);
}
