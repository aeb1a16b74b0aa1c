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

// The row function of a gated activation's name: "silu" or "swiglu_oai".
using GluRow = void (*)(const float*, const float*, float*, int64_t);
inline GluRow glu_row(const std::string& activation) {
  TORCH_CHECK(activation == "silu" || activation == "swiglu_oai", "activation must be silu or swiglu_oai, got '",
              activation, "'");
  return activation == "silu" ? &silu_mul_row : &swiglu_oai_row;
}

}  // namespace
