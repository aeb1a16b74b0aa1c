// The weight formats the kernels run (a block's quant bytes, bits and whether it has mins) and where a row keeps
// each field (RowLayout): shared by the decode dot products (quant_dot.h) and prefill's unpacking (prefill_gemm.h).
// Torch-free: compiled per ISA.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "kernels.h"

namespace {

using inferplug_isa::GROUP;
using inferplug_isa::QK;
using inferplug_isa::RUN;
using inferplug_isa::RUN_WORDS_BYTES;
using inferplug_isa::WORD;

// Per format: a block's quant bytes and whether it has mins.
struct Q4_1 {  // w = q * scale + min, q in 0..15; 16 bytes of nibbles (byte j: weight j low, j + 16 high)
  static constexpr int64_t QUANT_BYTES = 16;
  static constexpr int BITS = 4;
  static constexpr bool HAS_MIN = true;
};

struct Q4_K {  // Q4_1's nibbles under llama.cpp's Q4_K scales: w = d * sc * q - dmin * m, with fp16 d and dmin per 8 blocks
               // (a super-block) and 6-bit codes sc and m per block, a byte each (4.625 bits a weight against Q4_1's 5)
  static constexpr int64_t QUANT_BYTES = 16;
  static constexpr int BITS = 4;
  static constexpr bool HAS_MIN = true;
  static constexpr int64_t SUPER = 8;  // blocks per super-block: a row holds whole ones
};

struct Q4_G128 {  // Q4_1 blocks of an AWQ / GPTQ group of 128 inputs: their fp16 scale and min stored once per 4 blocks
                  // (4.25 bits a weight against Q4_1's 5, the same values)
  static constexpr int64_t QUANT_BYTES = 16;
  static constexpr int BITS = 4;
  static constexpr bool HAS_MIN = true;
  static constexpr int64_t SPAN = 4;  // blocks a scale covers: a row holds whole groups
};

struct Q8_0 {  // w = q * scale, 32 int8
  static constexpr int64_t QUANT_BYTES = 32;
  static constexpr int BITS = 8;
  static constexpr bool HAS_MIN = false;
};

// llama.cpp's Q5_K: Q4_K's scales over 5-bit codes q (0..31), w = d * sc * q - dmin * m. A block's 20 quant bytes:
// Q4_1's 16 bytes of low nibbles (byte j: weight j, j + 16), then a word of high bits, byte i's bit k the high bit of
// weight 4k + i and bit 4 + k that of weight 16 + 4k + i (k = 0..3): so each word of nibbles takes its high bits with
// one 16-bit shift and a 0x10 mask. 5.625 bits a weight (the file's 5.5 packs the codes 6 bits each).
struct Q5_K {
  static constexpr int64_t QUANT_BYTES = 20;
  static constexpr int BITS = 5;
  static constexpr bool HAS_MIN = true;
  static constexpr int64_t SUPER = 8;
};

// llama.cpp's Q5_0: w = d * (q - 16), q in 0..31, an fp16 d per block; its codes in Q5_K's 20 quant bytes (the
// kernels take q as it is and subtract 16 times x's sum after). 5.5 bits a weight, as the file's.
struct Q5_0 {
  static constexpr int64_t QUANT_BYTES = 20;
  static constexpr int BITS = 5;
  static constexpr bool HAS_MIN = false;
};

// llama.cpp's Q6_K: w = d * sc * (q - 32), q in 0..63, an int8 sc per 16 weights and an fp16 d per 8 blocks (a
// super-block of 256). A block's 24 quant bytes: its 16 bytes of low nibbles as Q4_1's (byte j: weight j, j + 16),
// then two words of high bit pairs, byte i of word h holding weight 16h + 4k + i's in bits 2k, 2k + 1 (k = 0..3):
// so each word of nibbles takes its high bits with one shift and mask. 6.5625 bits a weight, as the file's.
struct Q6_K {
  static constexpr int64_t QUANT_BYTES = 24;
  static constexpr int BITS = 6;
  static constexpr bool HAS_MIN = false;
  static constexpr int64_t SUPER = 8;
};

// gpt-oss's MXFP4 (OCP microscaling FP4): w = scale * v, v one of E2M1's values doubled (mxfp4_values: ggml's
// kvalues_mxfp4) indexed by a 4-bit code in Q4_1's nibble order, and scale = 2^(e - 128) from the file's E8M0 byte,
// held as an fp16 (exact where e - 128 is in [-24, 15]; models/gguf_layers.py checks). 4.5 bits a weight, the
// file's 4.25; the decode kernels look the codes up as int8 weights (Q8_0's signed dot products).
struct MXFP4 {
  static constexpr int64_t QUANT_BYTES = 16;
  static constexpr int BITS = 4;
  static constexpr bool HAS_MIN = false;
};

// What a format's codes are above its weights' integer values (Q5_0's q - 16): the dot products take the codes and
// subtract CODE_OFFSET times the block's sum of x's codes.
template <typename Format>
constexpr int CODE_OFFSET = 0;
template <>
constexpr int CODE_OFFSET<Q5_0> = 16;

// Whether a format's 4-bit codes index a table of int8 values (MXFP4's) instead of being the values.
template <typename Format>
constexpr bool LOOKUP = false;
template <>
constexpr bool LOOKUP<MXFP4> = true;

inline __m128i mxfp4_values() { return _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12); }

// The n <= 8 fp16 values at p as floats, zeros past n.
inline __m256 load_halves(const uint8_t* p, int64_t n) {
  if (n == GROUP) return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  uint16_t bits[GROUP] = {};
  std::memcpy(bits, p, n * 2);
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bits)));
}

inline float load_half(const uint8_t* p, int64_t i) { return _cvtsh_ss(reinterpret_cast<const uint16_t*>(p)[i]); }

// Block b's quant bytes in their plain order, from the runs' interleaved words (kernels.h).
template <typename Format>
void block_quants(const uint8_t* quants, int64_t b, int64_t blocks, uint8_t* out) {
  const int64_t run = b / RUN * RUN, in_run = std::min(RUN, blocks - run);
  for (int64_t k = 0; k < Format::QUANT_BYTES / WORD; k++)
    std::memcpy(out + k * WORD, quants + run * Format::QUANT_BYTES + k * WORD * in_run + (b - run) * WORD, WORD);
}

// Where a row's fields start (all fp16 scales, then all mins for Q4_1, then the quants), its bytes for a number of
// blocks (and the blocks a row of some bytes holds at most), and its blocks' scales and mins as floats: one at a
// time, or the n <= GROUP from block b (b a multiple of GROUP) as one vector.
template <typename Format>
struct RowLayout {
  const uint8_t *scales, *mins, *quants;
  RowLayout(const uint8_t* row, int64_t blocks)
      : scales(row), mins(row + 2 * blocks), quants(row + (Format::HAS_MIN ? 4 : 2) * blocks) {}
  static int64_t bytes(int64_t blocks) { return blocks * ((Format::HAS_MIN ? 4 : 2) + Format::QUANT_BYTES); }
  static int64_t blocks_in(int64_t row_bytes) { return row_bytes / bytes(1); }
  float scale(int64_t b) const { return load_half(scales, b); }
  float min(int64_t b) const { return Format::HAS_MIN ? load_half(mins, b) : 0.f; }
  __m256 group_scales(int64_t b, int64_t n) const { return load_halves(scales + 2 * b, n); }
  __m256 group_mins(int64_t b, int64_t n) const { return load_halves(mins + 2 * b, n); }
};

// Q4_G128's row: the groups' scales, their mins, then the quants. A float step's 8 blocks are two groups.
template <>
struct RowLayout<Q4_G128> {
  const uint8_t *scales, *mins, *quants;
  RowLayout(const uint8_t* row, int64_t blocks)
      : scales(row), mins(row + blocks / 2), quants(row + blocks) {}
  static int64_t bytes(int64_t blocks) { return blocks + blocks * Q4_G128::QUANT_BYTES; }
  static int64_t blocks_in(int64_t row_bytes) { return row_bytes / bytes(Q4_G128::SPAN) * Q4_G128::SPAN; }
  float scale(int64_t b) const { return load_half(scales, b / Q4_G128::SPAN); }
  float min(int64_t b) const { return load_half(mins, b / Q4_G128::SPAN); }
  __m256 group_scales(int64_t b, int64_t n) const { return each_four_times(scales, b, n); }
  __m256 group_mins(int64_t b, int64_t n) const { return each_four_times(mins, b, n); }

 private:
  static_assert(GROUP == 2 * Q4_G128::SPAN, "a float step takes two groups' values");
  // The two groups' fp16 values at block b, each in 4 lanes; zeros past the row's last group. Two 16-bit loads, not
  // load_halves' copy through the stack: that copy halved this kernel's speed.
  static __m256 each_four_times(const uint8_t* halves, int64_t b, int64_t n) {
    const uint16_t* at = reinterpret_cast<const uint16_t*>(halves) + b / Q4_G128::SPAN;
    const __m128i two = _mm_cvtsi32_si128(static_cast<int>(at[0] | (n > Q4_G128::SPAN ? uint32_t{at[1]} << 16 : 0u)));
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_cvtph_ps(two)), _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
  }
};

// The rows of K-quants with mins (Q4_K, Q5_K): all d, all dmin (a half each per super-block), all sc codes, all m
// codes, then the quants. A product d * sc (11 by 6 significant bits) is exact in float32, so each block's scale and
// min are the file's.
template <typename Format>
struct KMinsLayout {
  const uint8_t *d, *dmin, *sc, *m, *quants;
  KMinsLayout(const uint8_t* row, int64_t blocks)
      : d(row), dmin(row + blocks / 4), sc(row + blocks / 2), m(sc + blocks), quants(m + blocks) {}
  static int64_t bytes(int64_t blocks) { return blocks / 2 + 2 * blocks + blocks * Format::QUANT_BYTES; }
  static int64_t blocks_in(int64_t row_bytes) { return row_bytes / bytes(Format::SUPER) * Format::SUPER; }
  float scale(int64_t b) const { return load_half(d, b / Format::SUPER) * static_cast<float>(sc[b]); }
  float min(int64_t b) const { return -load_half(dmin, b / Format::SUPER) * static_cast<float>(m[b]); }
  __m256 group_scales(int64_t b, int64_t) const { return codes_times(sc + b, load_half(d, b / Format::SUPER)); }
  __m256 group_mins(int64_t b, int64_t) const { return codes_times(m + b, -load_half(dmin, b / Format::SUPER)); }
#ifdef INFERPLUG_AVX512
  // The scales (mins) of the 16 blocks from b, two whole super-blocks, in one 16-lane vector: one load, conversion
  // and multiply of the codes, where two 8-lane groups took three each and a join (the same products, so the same
  // bits). In cache a one-row Q4_K matmul 1.18x as fast, 8 rows 1.04x (Zen 4).
  __m512 step_scales(int64_t b) const { return codes_times(sc + b, supers(d, b)); }
  __m512 step_mins(int64_t b) const { return codes_times(m + b, _mm512_xor_ps(supers(dmin, b), _mm512_set1_ps(-0.f))); }
#endif

 private:
  static_assert(Format::SUPER == GROUP, "a float step takes one super-block's 8 scales");
  static __m256 codes_times(const uint8_t* codes, float factor) {
    const __m256 values = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes))));
    return _mm256_mul_ps(values, _mm256_set1_ps(factor));
  }
#ifdef INFERPLUG_AVX512
  static __m512 codes_times(const uint8_t* codes, __m512 factors) {
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)))), factors);
  }
  // The fp16 values of the two super-blocks from block b, each in 8 lanes.
  static __m512 supers(const uint8_t* halves, int64_t b) {
    int32_t two;
    std::memcpy(&two, halves + 2 * (b / Format::SUPER), sizeof two);
    const __m512i lanes = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    return _mm512_permutexvar_ps(lanes, _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128(two))));
  }
#endif
};

// Rows whose K-quant layout gives a 16-block step's scales and mins at once (step_scales, step_mins).
template <typename Format>
constexpr bool K_MINS = std::is_base_of_v<KMinsLayout<Format>, RowLayout<Format>>;

template <>
struct RowLayout<Q4_K> : KMinsLayout<Q4_K> {
  using KMinsLayout::KMinsLayout;
};

template <>
struct RowLayout<Q5_K> : KMinsLayout<Q5_K> {
  using KMinsLayout::KMinsLayout;
};

// Q6_K's row: all d (a half per super-block), all low-half scales, all high-half scales (int8), then the quants.
template <>
struct RowLayout<Q6_K> {
  const uint8_t *d, *quants;
  const int8_t *sc_low, *sc_high;
  RowLayout(const uint8_t* row, int64_t blocks)
      : d(row), quants(row + blocks / 4 + 2 * blocks), sc_low(reinterpret_cast<const int8_t*>(row + blocks / 4)),
        sc_high(sc_low + blocks) {}
  static int64_t bytes(int64_t blocks) { return blocks / 4 + 2 * blocks + blocks * Q6_K::QUANT_BYTES; }
  static int64_t blocks_in(int64_t row_bytes) { return row_bytes / bytes(Q6_K::SUPER) * Q6_K::SUPER; }
  float scale(int64_t b) const { return load_half(d, b / Q6_K::SUPER); }  // the sub-blocks' own scales apart
  float min(int64_t) const { return 0.f; }
  __m256 group_scales(int64_t b, int64_t) const { return _mm256_set1_ps(load_half(d, b / Q6_K::SUPER)); }
  __m256 group_mins(int64_t, int64_t) const { return _mm256_setzero_ps(); }
  static_assert(Q6_K::SUPER == GROUP, "a float step takes one super-block's 8 blocks");
};

}  // namespace
