// Float vectors of one width as a traits type (F256: AVX2, F512: AVX-512), so a kernel is written once and
// compiled at either width. Torch-free: isa_avx512.cpp compiles it with AVX-512 enabled.
// Everything sits in an anonymous namespace: each translation unit keeps its own copies, so an AVX-512
// copy of an inline function can never be the one the linker keeps for AVX2 code.
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace {

struct F256 {
  using F = __m256;
  using Mask = __m256;
  static constexpr int64_t LANES = 8;
  static F zero() { return _mm256_setzero_ps(); }
  static F set1(float v) { return _mm256_set1_ps(v); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static F load_half(const uint16_t* p) {  // LANES fp16 values (their bits) as floats: exact
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void store_half(uint16_t* p, F v) {  // rounded to the nearest fp16, ties to even (as torch's .half())
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F max(F a, F b) { return _mm256_max_ps(a, b); }  // b where either is NaN
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F fnmadd(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
  static Mask less(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
  static F zero_where(Mask m, F v) { return _mm256_andnot_ps(m, v); }
  static F round(F v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static F pow2(F n) {  // 2^n for whole n in the normal range
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
  // A vector from LANES / 8 vectors of 8 lanes in order, and back.
  static F from_eights(const __m256* eights) { return eights[0]; }
  static void to_eights(F v, __m256* eights) { eights[0] = v; }
  static float sum(F v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // Horizontal reductions of LANES vectors at once (op: add or max), by halving: pairs of vectors fold their
  // 128-bit halves into one, then pairs of lanes, then lanes; 21 one-uop shuffles and ops. Lane 4j + m of the
  // result reduces a[2m + j]: the caller puts its i-th vector at a[TREE_ORDER[i]]. Each vector's lanes go through
  // the same tree wherever it sits, so a value does not depend on its neighbours.
  static constexpr int TREE_ORDER[LANES] = {0, 2, 4, 6, 1, 3, 5, 7};
  template <typename Op>
  static F tree_of(const F a[LANES], Op op) {
    F b[4], c[2];
    for (int p = 0; p < 4; p++)
      b[p] = op(_mm256_permute2f128_ps(a[2 * p], a[2 * p + 1], 0x20), _mm256_permute2f128_ps(a[2 * p], a[2 * p + 1], 0x31));
    for (int p = 0; p < 2; p++)
      c[p] = op(_mm256_shuffle_ps(b[2 * p], b[2 * p + 1], 0x44), _mm256_shuffle_ps(b[2 * p], b[2 * p + 1], 0xEE));
    return op(_mm256_shuffle_ps(c[0], c[1], 0x88), _mm256_shuffle_ps(c[0], c[1], 0xDD));
  }
  static F sums_of(const F a[LANES]) { return tree_of(a, add); }
  static F maxes_of(const F a[LANES]) { return tree_of(a, max); }
};

#ifdef INFERPLUG_AVX512  // isa_avx512.cpp, under its target pragma
struct F512 {
  using F = __m512;
  using Mask = __mmask16;
  static constexpr int64_t LANES = 16;
  static F zero() { return _mm512_setzero_ps(); }
  static F set1(float v) { return _mm512_set1_ps(v); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static F load_half(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F max(F a, F b) { return _mm512_max_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F fnmadd(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
  static Mask less(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
  static F zero_where(Mask m, F v) { return _mm512_maskz_mov_ps(static_cast<Mask>(~m), v); }
  static F round(F v) { return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static F pow2(F n) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
  }
  static F from_eights(const __m256* eights) { return _mm512_insertf32x8(_mm512_castps256_ps512(eights[0]), eights[1], 1); }
  static void to_eights(F v, __m256* eights) {
    eights[0] = _mm512_castps512_ps256(v);
    eights[1] = _mm512_extractf32x8_ps(v, 1);
  }
  static float sum(F v) {
    return F256::sum(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
  }
  // As F256's: 256-bit halves, 128-bit quarters, pairs of lanes, lanes; 45 one-uop shuffles and ops. Lane 4j + m
  // reduces a[4m + j].
  static constexpr int TREE_ORDER[LANES] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
  template <typename Op>
  static F tree_of(const F a[LANES], Op op) {
    F b[8], c[4], e[2];
    for (int p = 0; p < 8; p++)
      b[p] = op(_mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0x44), _mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0xEE));
    for (int p = 0; p < 4; p++)
      c[p] = op(_mm512_shuffle_f32x4(b[2 * p], b[2 * p + 1], 0x88), _mm512_shuffle_f32x4(b[2 * p], b[2 * p + 1], 0xDD));
    for (int p = 0; p < 2; p++)
      e[p] = op(_mm512_shuffle_ps(c[2 * p], c[2 * p + 1], 0x44), _mm512_shuffle_ps(c[2 * p], c[2 * p + 1], 0xEE));
    return op(_mm512_shuffle_ps(e[0], e[1], 0x88), _mm512_shuffle_ps(e[0], e[1], 0xDD));
  }
  static F sums_of(const F a[LANES]) { return tree_of(a, add); }
  static F maxes_of(const F a[LANES]) { return tree_of(a, max); }
};
#endif

// n floats to fp16 (nearest, ties to even, as torch's .half()): LANES at a time, the tail one by one.
template <typename V>
void store_halves(uint16_t* out, const float* in, int64_t n) {
  int64_t i = 0;
  for (; i + V::LANES <= n; i += V::LANES) V::store_half(out + i, V::load(in + i));
  for (; i < n; i++) out[i] = _cvtss_sh(in[i], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

// exp(x) for x <= 0 (max-subtracted scores): 2^n * p(r), x = n ln2 + r, p Cephes' expf polynomial (~1 ulp).
// Below ln(FLT_MIN), -inf included, it gives 0; NaN stays NaN.
template <typename V>
typename V::F exp_nonpositive(typename V::F x) {
  const auto ln_flt_min = V::set1(-87.33654f);
  const auto underflow = V::less(x, ln_flt_min);
  x = V::max(ln_flt_min, x);
  const auto n = V::round(V::mul(x, V::set1(1.44269504f)));  // x / ln2, to the nearest
  auto r = V::fnmadd(n, V::set1(0.693359375f), x);            // ln2 in two parts: n * the first is exact
  r = V::fnmadd(n, V::set1(-2.12194440e-4f), r);
  auto p = V::set1(1.9875691500e-4f);
  for (const float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f})
    p = V::fmadd(p, r, V::set1(c));
  p = V::fmadd(p, V::mul(r, r), V::add(r, V::set1(1.f)));
  return V::zero_where(underflow, V::mul(p, V::pow2(n)));
}

}  // namespace
