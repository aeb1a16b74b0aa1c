// The quantized matmuls' inner loops (quant_matmul.cpp has the torch ops), written once over a Dot policy
// (how 8 blocks' int8 dot products become 8 int32 sums) and a float width. Torch-free: compiled per ISA.
//
// Every policy gives the same exact integer sums, and the float part (scales, mins, the running sum) is
// 8 lanes wide in every ISA, so Q4_1 / Q8_0 results are bit-identical across ISAs.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "kernels.h"
#include "simd.h"

namespace {

using inferplug_isa::GROUP;
using inferplug_isa::QK;

constexpr int64_t PREFETCH = 2048;  // bytes ahead

// Per format: a block's quant bytes, whether it has mins, and weight j of a block as a float (dequantize).
struct Q4_1 {  // w = q * scale + min, q in 0..15; 16 bytes of nibbles (byte j: weight j low, j + 16 high)
  static constexpr int64_t QUANT_BYTES = 16;
  static constexpr bool HAS_MIN = true;
  static float weight(const uint8_t* quants, int j) { return static_cast<float>(j < 16 ? quants[j] & 0x0F : quants[j - 16] >> 4); }
};

struct Q8_0 {  // w = q * scale, 32 int8
  static constexpr int64_t QUANT_BYTES = 32;
  static constexpr bool HAS_MIN = false;
  static float weight(const uint8_t* quants, int j) { return static_cast<float>(static_cast<int8_t>(quants[j])); }
};

// Where a row's fields start: scales, mins (Q4_1), quants.
template <typename Format>
struct RowLayout {
  const uint8_t *scales, *mins, *quants;
  RowLayout(const uint8_t* row, int64_t blocks)
      : scales(row), mins(row + 2 * blocks), quants(row + (Format::HAS_MIN ? 4 : 2) * blocks) {}
  static int64_t bytes(int64_t blocks) { return blocks * ((Format::HAS_MIN ? 4 : 2) + Format::QUANT_BYTES); }
};

// The n <= 8 fp16 values at p as floats, zeros past n.
inline __m256 load_halves(const uint8_t* p, int64_t n) {
  if (n == GROUP) return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  uint16_t bits[GROUP] = {};
  std::memcpy(bits, p, n * 2);
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bits)));
}

// The hardware prefetcher alone leaves the cores waiting on DRAM: ask for the lines PREFETCH bytes past a row.
inline void prefetch_ahead(const uint8_t* row, int64_t bytes) {
  for (int64_t at = 0; at < bytes; at += 64) _mm_prefetch(reinterpret_cast<const char*>(row + PREFETCH + at), _MM_HINT_T0);
}

// One block a 256-bit register. Weights go in as unsigned bytes: Q4_1's nibbles as they are, Q8_0's as |q|
// with x's bytes given q's signs. `count` (1 here) is how many blocks remain in the row.
template <typename Product>
struct Dot256 {
  using R = __m256i;
  static constexpr int64_t BLOCKS = 1;
  struct Weights { R bytes, signs; };

  template <typename Format>
  static Weights load(const uint8_t* quants, int64_t) {
    if constexpr (Format::HAS_MIN) {
      const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(quants));
      return {_mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), _mm256_set1_epi8(0x0F)), R{}};
    } else {
      const R q = _mm256_loadu_si256(reinterpret_cast<const R*>(quants));
      return {_mm256_sign_epi8(q, q), q};
    }
  }
  template <typename Format>
  static R dot(const Weights& w, const int8_t* x) {
    R xv = _mm256_loadu_si256(reinterpret_cast<const R*>(x));
    if constexpr (!Format::HAS_MIN) xv = _mm256_sign_epi8(xv, w.signs);
    return Product::dot(w.bytes, xv);
  }
  static __m256i block_sums(const R d[GROUP]) { return sums_of(d); }
};

struct MaddProduct {  // AVX2: u8 x s8 pairs to int16 (no saturation: |15 * 127 * 2|, |128 * 127 * 2| < 32767), then int32
  static __m256i dot(__m256i u, __m256i s) { return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)); }
};

#ifdef INFERPLUG_AVX512
struct VnniProduct {  // AVX512-VNNI at 256 bits: u8 x s8 quads straight into int32
  static __m256i dot(__m256i u, __m256i s) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s); }
};

// Two blocks a 512-bit register (VNNI); x keeps its plain layout, so a pair's 64 bytes are two whole blocks.
struct Dot512 {
  using R = __m512i;
  static constexpr int64_t BLOCKS = 2;
  struct Weights { R bytes; __mmask64 negative; };

  template <typename Format>
  static Weights load(const uint8_t* quants, int64_t count) {  // count 1: the row's last block, read no further
    if constexpr (Format::HAS_MIN) {
      const __m256i packed = _mm256_maskz_loadu_epi8(count >= 2 ? ~0u : 0xFFFFu, quants);
      // [b0, b0, b1, b1] by 128-bit lanes, then low nibbles in lanes 0 and 2, high ones in 1 and 3.
      const R both = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3), _mm512_castsi256_si512(packed));
      return {_mm512_and_si512(_mm512_mask_srli_epi16(both, 0xFF00FF00u, both, 4), _mm512_set1_epi8(0x0F)), 0};
    } else {
      const R q = _mm512_maskz_loadu_epi8(count >= 2 ? ~0ull : 0xFFFFFFFFull, quants);
      return {_mm512_abs_epi8(q), _mm512_movepi8_mask(q)};
    }
  }
  template <typename Format>
  static R dot(const Weights& w, const int8_t* x) {
    R xv = _mm512_loadu_si512(x);
    if constexpr (!Format::HAS_MIN) xv = _mm512_mask_sub_epi8(xv, w.negative, _mm512_setzero_si512(), xv);
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), w.bytes, xv);
  }
  static __m256i block_sums(const R d[GROUP / 2]) {
    __m256i halves[GROUP];
    for (int64_t i = 0; i < GROUP / 2; i++) {
      halves[2 * i] = _mm512_castsi512_si256(d[i]);
      halves[2 * i + 1] = _mm512_extracti64x4_epi64(d[i], 1);
    }
    return sums_of(halves);
  }
};
#endif

// Rows [m, m + MT) of x against one weight row: MT dot products sharing each unpacked weight block.
template <typename Dot, typename Format, int MT>
void dot_rows(const uint8_t* row, const inferplug_isa::QuantizedRows& x, int64_t m, int64_t blocks, int64_t row_bytes,
              float* y, int64_t y_stride) {
  constexpr int64_t REGS = GROUP / Dot::BLOCKS;
  const RowLayout<Format> w(row, blocks);
  prefetch_ahead(row, row_bytes);
  __m256 acc[MT];
  for (int i = 0; i < MT; i++) acc[i] = _mm256_setzero_ps();
  auto group = [&](int64_t b, auto whole) {  // blocks [b, b + n): n = GROUP but in a row's last group
    constexpr bool WHOLE = decltype(whole)::value;
    const int64_t n = WHOLE ? GROUP : blocks - b;
    const __m256 scale = load_halves(w.scales + 2 * b, n);
    const __m256 min = Format::HAS_MIN ? load_halves(w.mins + 2 * b, n) : _mm256_setzero_ps();
    const uint8_t* quants = w.quants + b * Format::QUANT_BYTES;
    typename Dot::Weights q[REGS];
    for (int64_t r = 0; r < REGS; r++)
      if (WHOLE || r * Dot::BLOCKS < n) q[r] = Dot::template load<Format>(quants + r * Dot::BLOCKS * Format::QUANT_BYTES, n - r * Dot::BLOCKS);
    for (int i = 0; i < MT; i++) {
      const int64_t at = (m + i) * x.blocks + b;
      typename Dot::R dots[REGS];
      for (int64_t r = 0; r < REGS; r++)  // x's padding blocks are zeros: a pair's missing half adds nothing
        dots[r] = WHOLE || r * Dot::BLOCKS < n ? Dot::template dot<Format>(q[r], x.q + (at + r * Dot::BLOCKS) * QK) : typename Dot::R{};
      const __m256 scales = _mm256_mul_ps(scale, _mm256_loadu_ps(x.scale + at));
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(Dot::block_sums(dots)), scales, acc[i]);
      if constexpr (Format::HAS_MIN) acc[i] = _mm256_fmadd_ps(min, _mm256_loadu_ps(x.sum + at), acc[i]);
    }
  };
  int64_t b = 0;
  for (; b + GROUP <= blocks; b += GROUP) group(b, std::true_type{});
  if (b < blocks) group(b, std::false_type{});
  for (int i = 0; i < MT; i++) y[i * y_stride] = F256::sum(acc[i]);
}

// Rows [m, m + MT) of float x against one Q8_0 weight row, without rounding x to int8: the lm_head, whose
// logits pick every token. A block's 32 weights become floats once for all MT rows.
template <typename V, int MT>
void dot_rows_float(const uint8_t* row, const float* x, int64_t k, int64_t blocks, int64_t row_bytes, float* y,
                    int64_t y_stride) {
  constexpr int64_t PARTS = QK / V::LANES;
  const RowLayout<Q8_0> w(row, blocks);
  prefetch_ahead(row, row_bytes);
  typename V::F acc[MT];
  for (int i = 0; i < MT; i++) acc[i] = V::zero();
  for (int64_t b = 0; b < blocks; b += GROUP) {
    const int64_t n = std::min(GROUP, blocks - b);
    float scales[GROUP];
    _mm256_storeu_ps(scales, load_halves(w.scales + 2 * b, n));
    for (int64_t j = 0; j < n; j++) {
      const int8_t* quants = reinterpret_cast<const int8_t*>(w.quants + (b + j) * QK);
      typename V::F q[PARTS];
      for (int64_t l = 0; l < PARTS; l++) q[l] = V::load_i8(quants + V::LANES * l);
      for (int i = 0; i < MT; i++) {
        const float* xb = x + i * k + (b + j) * QK;
        auto dot = V::mul(q[0], V::load(xb));
        for (int64_t l = 1; l < PARTS; l++) dot = V::fmadd(q[l], V::load(xb + V::LANES * l), dot);
        acc[i] = V::fmadd(dot, V::set1(scales[j]), acc[i]);
      }
    }
  }
  for (int i = 0; i < MT; i++) y[i * y_stride] = V::sum(acc[i]);
}

// f(integral_constant<int, rows>) for 1 <= rows <= MT: the row count as a compile-time constant.
template <int MT, typename F>
void with_rows(int64_t rows, const F& f) {
  if constexpr (MT > 1) {
    if (rows < MT) return with_rows<MT - 1>(rows, f);
  }
  f(std::integral_constant<int, MT>{});
}

template <typename Dot, typename Format>
void quant_matmul_rows(const inferplug_isa::WeightRows& w, int64_t n0, int64_t n1, const inferplug_isa::QuantizedRows& x,
                       int64_t m, int64_t rows, float* y, int64_t y_stride) {
  with_rows<inferplug_isa::MAX_ROWS>(rows, [&](auto mt) {
    for (int64_t n = n0; n < n1; n++)
      dot_rows<Dot, Format, decltype(mt)::value>(w.data + n * w.row_bytes, x, m, w.blocks, w.row_bytes, y + n - n0, y_stride);
  });
}

template <typename V>
void float_matmul_rows(const inferplug_isa::WeightRows& w, int64_t n0, int64_t n1, const float* x, int64_t k,
                       int64_t rows, float* y, int64_t y_stride) {
  with_rows<inferplug_isa::MAX_ROWS>(rows, [&](auto mt) {
    for (int64_t n = n0; n < n1; n++)
      dot_rows_float<V, decltype(mt)::value>(w.data + n * w.row_bytes, x, k, w.blocks, w.row_bytes, y + n - n0, y_stride);
  });
}

}  // namespace
