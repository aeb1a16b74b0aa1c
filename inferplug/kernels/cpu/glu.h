// A gated MLP's activation on one row: shared by the dense layers' op (layer_ops.cpp) and an MoE layer's experts
// (moe_experts.cpp), so both round alike.
#pragma once
#include <immintrin.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "simd.h"

namespace {

// row[i] = silu(gate[i]) * up[i] for i < n.
inline void silu_mul_row(const float* gate, const float* up, float* row, int64_t n) {
  int64_t i = 0;
  // silu(g) = g / (1 + e^-g), as torch computes it; for g < 0, g e^g / (1 + e^g), so the exp never overflows.
  const __m256 one = _mm256_set1_ps(1.f), sign = _mm256_set1_ps(-0.f);
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = exp_nonpositive<F256>(_mm256_or_ps(g, sign));  // e^-|g|
    const __m256 numerator = _mm256_blendv_ps(g, _mm256_mul_ps(g, e), g);  // blend on g's sign bit
    const __m256 silu = _mm256_div_ps(numerator, _mm256_add_ps(one, e));
    _mm256_storeu_ps(row + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; i++) row[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
}

// gpt-oss's swiglu_oai: g = min(gate, 7), u = clamp(up, -7, 7), row = g * sigmoid(1.702 g) * (u + 1), for i < n.
constexpr float SWIGLU_LIMIT = 7.f, SWIGLU_ALPHA = 1.702f;
inline void swiglu_oai_row(const float* gate, const float* up, float* row, int64_t n) {
  int64_t i = 0;
  // sigmoid(a) = 1 / (1 + e^-a); for a < 0, e^a / (1 + e^a): the exp never overflows
  const __m256 one = _mm256_set1_ps(1.f), sign = _mm256_set1_ps(-0.f), limit = _mm256_set1_ps(SWIGLU_LIMIT);
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_min_ps(_mm256_loadu_ps(gate + i), limit);
    const __m256 u = _mm256_max_ps(_mm256_min_ps(_mm256_loadu_ps(up + i), limit), _mm256_set1_ps(-SWIGLU_LIMIT));
    const __m256 a = _mm256_mul_ps(g, _mm256_set1_ps(SWIGLU_ALPHA));
    const __m256 e = exp_nonpositive<F256>(_mm256_or_ps(a, sign));  // e^-|a|
    const __m256 sigmoid = _mm256_div_ps(_mm256_blendv_ps(one, e, a), _mm256_add_ps(one, e));  // blend on a's sign
    _mm256_storeu_ps(row + i, _mm256_mul_ps(_mm256_mul_ps(g, sigmoid), _mm256_add_ps(u, one)));
  }
  for (; i < n; i++) {
    const float g = std::min(gate[i], SWIGLU_LIMIT), u = std::max(std::min(up[i], SWIGLU_LIMIT), -SWIGLU_LIMIT);
    row[i] = g / (1.f + std::exp(-SWIGLU_ALPHA * g)) * (u + 1.f);
  }
}

// GeGLU (Gemma): row[i] = gelu(gate[i]) * up[i], gelu's tanh form as torch's approximate="tanh",
// 0.5 g (1 + tanh(a)) with a = sqrt(2 / pi) (g + 0.044715 g^3), taken as g sigmoid(2a): the same value without
// 1 + tanh's cancellation in the negative tail. For i < n.
constexpr float GELU_SCALE = 0.7978845608028654f, GELU_CUBE = 0.044715f;
inline void gelu_tanh_mul_row(const float* gate, const float* up, float* row, int64_t n) {
  int64_t i = 0;
  const __m256 one = _mm256_set1_ps(1.f), sign = _mm256_set1_ps(-0.f);
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 cubic = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(GELU_CUBE), g), _mm256_mul_ps(g, g), g);
    const __m256 a2 = _mm256_mul_ps(_mm256_set1_ps(2.f * GELU_SCALE), cubic);
    const __m256 e = exp_nonpositive<F256>(_mm256_or_ps(a2, sign));  // e^-|2a|: the exp never overflows
    const __m256 numerator = _mm256_blendv_ps(g, _mm256_mul_ps(g, e), a2);  // a < 0: g e^2a / (1 + e^2a)
    const __m256 gelu = _mm256_div_ps(numerator, _mm256_add_ps(one, e));
    _mm256_storeu_ps(row + i, _mm256_mul_ps(gelu, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; i++) {
    const float g = gate[i], a2 = 2.f * GELU_SCALE * (g + GELU_CUBE * g * g * g);
    row[i] = (a2 >= 0.f ? g / (1.f + std::exp(-a2)) : g * std::exp(a2) / (1.f + std::exp(a2))) * up[i];
  }
}

// The row function of a gated activation's name: "silu", "swiglu_oai" or "gelu_tanh".
using GluRow = void (*)(const float*, const float*, float*, int64_t);
inline GluRow glu_row(const std::string& activation) {
  TORCH_CHECK(activation == "silu" || activation == "swiglu_oai" || activation == "gelu_tanh",
              "activation must be silu, swiglu_oai or gelu_tanh, got '", activation, "'");
  return activation == "silu" ? &silu_mul_row : activation == "swiglu_oai" ? &swiglu_oai_row : &gelu_tanh_mul_row;
}

}  // namespace
