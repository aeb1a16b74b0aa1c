// AVX2 math the kernels share.
#pragma once
#include <immintrin.h>

namespace vec {

// [sum(a[0]), ..., sum(a[7])]: 8 horizontal sums in one vector (hadd works within 128-bit halves).
inline __m256 sums_of(const __m256 a[8]) {
  const __m256 low = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 high = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(low, high, 0x20), _mm256_permute2f128_ps(low, high, 0x31));
}

inline __m256i sums_of(const __m256i a[8]) {
  const __m256i low = _mm256_hadd_epi32(_mm256_hadd_epi32(a[0], a[1]), _mm256_hadd_epi32(a[2], a[3]));
  const __m256i high = _mm256_hadd_epi32(_mm256_hadd_epi32(a[4], a[5]), _mm256_hadd_epi32(a[6], a[7]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(low, high, 0x20), _mm256_permute2x128_si256(low, high, 0x31));
}

// exp(x) for x <= 0 (max-subtracted scores): 2^n * p(r), x = n ln2 + r, p Cephes' expf polynomial (~1 ulp).
// Below ln(FLT_MIN), -inf included, it gives 0; NaN stays NaN.
inline __m256 exp_nonpositive(__m256 x) {
  const __m256 ln_flt_min = _mm256_set1_ps(-87.33654f);
  const __m256 underflow = _mm256_cmp_ps(x, ln_flt_min, _CMP_LT_OQ);
  x = _mm256_max_ps(ln_flt_min, x);  // max_ps returns its second operand for NaN
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),  // x / ln2, to the nearest
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);  // ln2 in two parts: n * the first is exact
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  for (const float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f})
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i two_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(two_n)));
}

}  // namespace vec
