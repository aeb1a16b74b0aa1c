// A gated MLP's activation on one row: shared by the dense layers' op (layer_ops.cpp) and an MoE layer's experts
// (moe_experts.cpp), so both round alike.
#pragma once
#include <immintrin.h>

#include <cmath>
#include <cstdint>

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

}  // namespace
