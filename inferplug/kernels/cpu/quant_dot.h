// The quantized matmuls' inner loops (quant_matmul.cpp has the torch ops), written once over a Dot policy
// (how 8 or 16 blocks' int8 dot products become one int32 sum a block) and a float width. Torch-free:
// compiled per ISA.
//
// Every policy gives the same exact integer sums, and the float part (scales, mins, the running sums) takes the
// same steps in every ISA (RunSums), so Q4_1 / Q4_G128 / Q4_K / Q5_0 / Q5_K / Q6_K / Q8_0 / MXFP4 results are bit-identical across ISAs.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "block_formats.h"
#include "kernels.h"
#include "simd.h"

namespace {

// The hardware prefetcher alone leaves the cores waiting on DRAM: ask for a row's lines ahead of their use, into L1
// (T0) or into L2 only (T1).
template <bool L2_ONLY = false>
inline void prefetch_row(const uint8_t* row, int64_t bytes) {
  for (int64_t at = 0; at < bytes; at += 64)
    _mm_prefetch(reinterpret_cast<const char*>(row + at), L2_ONLY ? _MM_HINT_T1 : _MM_HINT_T0);
}

// Long weight rows taken whole (one or two rows of x) also ask for their lines FAR_AHEAD bytes on, into L2. The
// segment ahead that comes into L1 is then an L2 hit. Measured on Zen 4 (2 threads, 1 GB sets on 2 MiB pages, in one
// process): the 12288-input down_proj 1.19-1.29x the GB/s as Q4_K and 1.19x as Q6_K, the 4096-input Q6_K head
// 1.15-1.19x (AVX2: 1.22x, 1.50x, 1.04x); but 4096-input Q4_K rows (2.3 KiB), which ran at 35-45 GB/s already,
// 0.82-0.97x, so rows under LONG_ROW_BYTES leave it out. A one-stream step: Qwen3-8B 0.92-0.93x the time, Qwen3.5-9B
// 0.93x; 2 streams flat; 8 (x cut in chunks) and Qwen3-30B-A3B's short expert rows untouched.
constexpr int64_t FAR_AHEAD = 16384, LONG_ROW_BYTES = 3072;

// f(integral_constant<int, k>) for k = 0..3: a word's index as a compile-time constant (its shift count). Inlined,
// with f: GCC kept it a call, and the 8 unpacked weight vectors went through the stack (a quarter of a Q6_K matmul).
#define INFERPLUG_INLINE __attribute__((always_inline))
template <typename F>
INFERPLUG_INLINE inline void with_each_k(const F& f) {
  f(std::integral_constant<int, 0>{});
  f(std::integral_constant<int, 1>{});
  f(std::integral_constant<int, 2>{});
  f(std::integral_constant<int, 3>{});
}

// Where word k of nibbles (UPPER: its high nibbles, weights 16 + 4k + i) finds its weights' high bits in the high
// word(s) of Q5_K / Q6_K (block_formats.h): a 16-bit shift (left if positive) takes them to bit 4 (Q6_K's pairs to
// bits 4, 5) of each byte, and the mask drops the bits a shift carried across bytes.
constexpr int high_shift(int bits, int k, bool upper) { return bits == 6 ? 4 - 2 * k : upper ? -k : 4 - k; }
constexpr int high_mask(int bits) { return bits == 6 ? 0x30 : 0x10; }

constexpr int log2_of(int power) { return power > 1 ? 1 + log2_of(power / 2) : 0; }
static_assert(CODE_OFFSET<Q5_0> == 1 << log2_of(CODE_OFFSET<Q5_0>), "a code offset is a power of two: a shift");

// Q6_K's blocks by halves of 16 weights: each half's exact sum of (code - 32) x, its integer sum over the codes q
// (0..63) started from x's -32 x_half (QuantizedRows' q6_low, q6_high: worked out once a row, not once a weight row).
// Their sub-block scales multiply in the float step, not as two int32 multiplies a row: with AVX-512 an 8-row
// matmul 10% faster and one row 9%; the AVX2 set, which takes the same float steps, 7% slower at one row and no
// slower at 8.
template <typename Dot, typename Format>
INFERPLUG_INLINE inline typename Dot::Halves half_sums(const typename Dot::template Weights<Format>& w, const int8_t* x,
                                                       const int32_t* low, const int32_t* high) {
  return Dot::dot_halves(w.bytes, x, Dot::load_sums(low), Dot::load_sums(high));
}

// The weight bytes the integer policies multiply are unsigned: Q4_1's nibbles as they are, Q8_0's (and MXFP4's
// looked-up values) as |q|, with x's bytes negated where q < 0. Each policy's load() takes `n` blocks' words (n <= BLOCKS, the rest
// zeros), word row k at words + k * stride; dot() gives each block's int32 sum in its lane.
struct DotAvx2 {  // 8 blocks a step: u8 x s8 pairs to int16, then int32
  using R = __m256i;
  static constexpr int64_t BLOCKS = 8;
  template <typename Format>
  struct Weights { R bytes[8], signs[Format::BITS == 8 || LOOKUP<Format> ? 8 : 1]; };
  struct Halves { R low, high; };  // each block's sums over its weights 0..15 and 16..31

  static R load_words(const uint8_t* p, int64_t n) {
    if (n == BLOCKS) return _mm256_loadu_si256(reinterpret_cast<const R*>(p));
    const R mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return _mm256_maskload_epi32(reinterpret_cast<const int*>(p), mask);
  }
  template <typename Format>
  static Weights<Format> load(const uint8_t* words, int64_t stride, int64_t n) {
    Weights<Format> w;
    if constexpr (Format::BITS == 4) {
      for (int k = 0; k < 4; k++) {  // low nibbles: weights 4k..4k+3 of each block; high ones: 16 + 4k..
        const R packed = load_words(words + k * stride, n);
        w.bytes[k] = _mm256_and_si256(packed, _mm256_set1_epi8(0x0F));
        w.bytes[k + 4] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), _mm256_set1_epi8(0x0F));
      }
      if constexpr (LOOKUP<Format>) {  // the codes' int8 values, as Q8_0's: |value| and its sign
        const R table = _mm256_broadcastsi128_si256(mxfp4_values());
        for (int k = 0; k < 8; k++) {
          w.signs[k] = _mm256_shuffle_epi8(table, w.bytes[k]);
          w.bytes[k] = _mm256_sign_epi8(w.signs[k], w.signs[k]);
        }
      }
    } else if constexpr (Format::BITS == 5 || Format::BITS == 6) {  // Q5_K: one high word for both halves
      const R high[2] = {load_words(words + 4 * stride, n), load_words(words + (Format::BITS == 6 ? 5 : 4) * stride, n)};
      with_each_k([&](auto k) INFERPLUG_INLINE {
        const R packed = load_words(words + k * stride, n);
        w.bytes[k] = _mm256_or_si256(_mm256_and_si256(packed, _mm256_set1_epi8(0x0F)),
                                     high_bits<high_shift(Format::BITS, k, false), high_mask(Format::BITS)>(high[0]));
        w.bytes[k + 4] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(packed, 4), _mm256_set1_epi8(0x0F)),
                                         high_bits<high_shift(Format::BITS, k, true), high_mask(Format::BITS)>(high[1]));
      });
    } else {
      for (int k = 0; k < 8; k++) {
        w.signs[k] = load_words(words + k * stride, n);
        w.bytes[k] = _mm256_sign_epi8(w.signs[k], w.signs[k]);
      }
    }
    return w;
  }
  template <int SHIFT, int MASK>  // high_shift's, high_mask's
  static R high_bits(R h) {
    if constexpr (SHIFT > 0) h = _mm256_slli_epi16(h, SHIFT);
    if constexpr (SHIFT < 0) h = _mm256_srli_epi16(h, -SHIFT);
    return _mm256_and_si256(h, _mm256_set1_epi8(MASK));
  }
  static Halves dot_halves(const R* bytes, const int8_t* x, R low, R high) {  // |63 * 127| pairs: int32 after each
    const R ones = _mm256_set1_epi16(1);
    auto xk = [&](int k) { return _mm256_loadu_si256(reinterpret_cast<const R*>(x + k * RUN_WORDS_BYTES)); };
    Halves s{low, high};
    for (int k = 0; k < 4; k++) {
      s.low = _mm256_add_epi32(s.low, _mm256_madd_epi16(_mm256_maddubs_epi16(bytes[k], xk(k)), ones));
      s.high = _mm256_add_epi32(s.high, _mm256_madd_epi16(_mm256_maddubs_epi16(bytes[k + 4], xk(k + 4)), ones));
    }
    return s;
  }
  static R load_sums(const int32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const R*>(p)); }
  static R widen_scales(const int8_t* p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }

  template <typename Format>
  static R dot(const Weights<Format>& w, const int8_t* x, const int32_t* q_sums) {
    const R ones = _mm256_set1_epi16(1);
    auto xk = [&](int k) { return _mm256_loadu_si256(reinterpret_cast<const R*>(x + k * RUN_WORDS_BYTES)); };
    if constexpr (Format::BITS <= 5 && !LOOKUP<Format>) {  // int16 holds 8 maddubs of 4-bit codes (8 x 2 x 15 x 127), 4 of 5-bit ones
      constexpr int IN_INT16 = Format::BITS == 4 ? 8 : 4;
      R sums = _mm256_setzero_si256();
      for (int k0 = 0; k0 < 8; k0 += IN_INT16) {
        R pairs = _mm256_maddubs_epi16(w.bytes[k0], xk(k0));
        for (int k = k0 + 1; k < k0 + IN_INT16; k++) pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(w.bytes[k], xk(k)));
        sums = _mm256_add_epi32(sums, _mm256_madd_epi16(pairs, ones));
      }
      if constexpr (CODE_OFFSET<Format> != 0)
        sums = _mm256_sub_epi32(sums, _mm256_slli_epi32(load_sums(q_sums), log2_of(CODE_OFFSET<Format>)));
      return sums;
    } else {  // |128 * 127| pairs: int32 after each
      R sums = _mm256_setzero_si256();
      for (int k = 0; k < 8; k++)
        sums = _mm256_add_epi32(sums, _mm256_madd_epi16(_mm256_maddubs_epi16(w.bytes[k], _mm256_sign_epi8(xk(k), w.signs[k])), ones));
      return sums;
    }
  }
  using V = F256;  // the float step's width: a lane a block
  static __m256 to_float(R sums) { return _mm256_cvtepi32_ps(sums); }
};

#ifdef INFERPLUG_AVX512
struct I512 {  // AVX-512 + VNNI: 16 blocks a step, two groups of 8
  using R = __m512i;
  using ByteMask = __mmask64;
  static constexpr int64_t BLOCKS = 16;
  static R load_words(const uint8_t* p, int64_t n) {
    return n == BLOCKS ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi32(static_cast<__mmask16>((1u << n) - 1), p);
  }
  static R load(const int8_t* p) { return _mm512_loadu_si512(p); }
  static R load_sums(const int32_t* p) { return _mm512_loadu_si512(p); }
  static R flip_sign_bits(R v) { return _mm512_xor_si512(v, _mm512_set1_epi8(static_cast<char>(0x80))); }
  template <int SHIFT>  // sums - 2^SHIFT q_sums
  static R minus_shifted(R sums, R q_sums) { return _mm512_sub_epi32(sums, _mm512_slli_epi32(q_sums, SHIFT)); }
  static R low_nibbles(R v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0F)); }
  static R high_nibbles(R v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F)); }
  static R lookup(__m128i table, R codes) { return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(table), codes); }
  static R dpbusd(R acc, R u, R s) { return _mm512_dpbusd_epi32(acc, u, s); }
  static R zero() { return _mm512_setzero_si512(); }
  template <int SHIFT>  // as DotAvx2::high_bits, unmasked
  static R shifted(R h) {
    if constexpr (SHIFT > 0) h = _mm512_slli_epi16(h, SHIFT);
    if constexpr (SHIFT < 0) h = _mm512_srli_epi16(h, -SHIFT);
    return h;
  }
  // Each byte: bits 0..3 of `nibble` under bits 4.. of `high`, cut to BITS bits: one bit-select (ternary logic 0xE4:
  // c ? a : b, c the 0x0F mask) and an and, where masking each and or-ing them took three.
  template <int BITS>
  static R codes(R nibble, R high) {
    const R merged = _mm512_ternarylogic_epi32(nibble, high, _mm512_set1_epi8(0x0F), 0xE4);
    return _mm512_and_si512(merged, _mm512_set1_epi8(static_cast<char>((1 << BITS) - 1)));
  }
  static R widen_scales(const int8_t* p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  using V = F512;
  static __m512 to_float(R sums) { return _mm512_cvtepi32_ps(sums); }
};

// VNNI: u8 x s8 quads straight into each block's int32 lane, at the width of I (a 256-bit I measured no
// faster than I512 here). Q8_0's signed weights go in as q + 128 (their sign bit flipped; MXFP4's codes look up
// their values + 128), and 128 times the block's sum of x's codes comes off after: the same exact integers as |q| against sign-flipped x, one op a vector
// instead of three (int32 sums cannot overflow: 32 x 255 x 127 per block).
template <typename I>
struct DotVnni {
  using R = typename I::R;
  static constexpr int64_t BLOCKS = I::BLOCKS;
  template <typename Format>
  struct Weights { R bytes[8]; };
  struct Halves { R low, high; };

  template <typename Format>
  static Weights<Format> load(const uint8_t* words, int64_t stride, int64_t n) {
    Weights<Format> w;
    if constexpr (Format::BITS == 4) {
      for (int k = 0; k < 4; k++) {
        const R packed = I::load_words(words + k * stride, n);
        w.bytes[k] = I::low_nibbles(packed);
        w.bytes[k + 4] = I::high_nibbles(packed);
      }
      if constexpr (LOOKUP<Format>) {
        const __m128i plus_128 = _mm_xor_si128(mxfp4_values(), _mm_set1_epi8(static_cast<char>(0x80)));
        for (int k = 0; k < 8; k++) w.bytes[k] = I::lookup(plus_128, w.bytes[k]);
      }
    } else if constexpr (Format::BITS == 5 || Format::BITS == 6) {  // as DotAvx2's, each code one bit-select (codes)
      const R high[2] = {I::load_words(words + 4 * stride, n), I::load_words(words + (Format::BITS == 6 ? 5 : 4) * stride, n)};
      with_each_k([&](auto k) INFERPLUG_INLINE {
        const R packed = I::load_words(words + k * stride, n);
        w.bytes[k] = I::template codes<Format::BITS>(packed, I::template shifted<high_shift(Format::BITS, k, false)>(high[0]));
        w.bytes[k + 4] = I::template codes<Format::BITS>(I::template shifted<-4>(packed),
                                                         I::template shifted<high_shift(Format::BITS, k, true)>(high[1]));
      });
    } else {
      for (int k = 0; k < 8; k++) w.bytes[k] = I::flip_sign_bits(I::load_words(words + k * stride, n));
    }
    return w;
  }
  template <typename Format>
  static R dot(const Weights<Format>& w, const int8_t* x, const int32_t* q_sums) {
    R sums = I::zero();
    for (int k = 0; k < 8; k++) sums = I::dpbusd(sums, w.bytes[k], I::load(x + k * RUN_WORDS_BYTES));
    if constexpr (Format::BITS == 8 || LOOKUP<Format>) sums = I::template minus_shifted<7>(sums, I::load_sums(q_sums));
    if constexpr (CODE_OFFSET<Format> != 0)
      sums = I::template minus_shifted<log2_of(CODE_OFFSET<Format>)>(sums, I::load_sums(q_sums));
    return sums;
  }
  static Halves dot_halves(const R* bytes, const int8_t* x, R low, R high) {
    Halves s{low, high};
    for (int k = 0; k < 4; k++) {
      s.low = I::dpbusd(s.low, bytes[k], I::load(x + k * RUN_WORDS_BYTES));
      s.high = I::dpbusd(s.high, bytes[k + 4], I::load(x + (k + 4) * RUN_WORDS_BYTES));
    }
    return s;
  }
  static R load_sums(const int32_t* p) { return I::load_sums(p); }
  static R widen_scales(const int8_t* p) { return I::widen_scales(p); }
  using V = typename I::V;
  static auto to_float(R sums) { return I::to_float(sums); }
};
#endif

// Weight rows a pass carries sums for, and the blocks of x it takes at a time: every weight row of a pass multiplies
// the same chunk of x's blocks before the next chunk, so that chunk stays in L1 (8 rows of x over a 7B down_proj's
// 14336 inputs, 112 KiB of int8, came from L2 again for every weight row: half the speed at 8 rows). Each sum still
// takes its blocks in order, so the chunking changes no result.
constexpr int64_t PASS_ROWS = 16;

// Blocks a chunk of mt rows takes: x_bytes of x, a multiple of RUN (so of every format's span of blocks). Measured
// on Zen 4 (32 KiB L1), run-major x: 8 KiB against 16 KiB and whole rows, 8-row matmuls out of DRAM 15-30% faster on
// both ISAs; a smaller chunk lost where the weights sat in L2 (each chunk stores and reloads its rows' sums). One or
// two rows take 16 KiB, whole rows at every width up to 16384 inputs: each weight row is then one stream, where a
// 12288-input down_proj cut in 128-block chunks made a pass 16 interleaved ones (2 Zen 4 threads out of DRAM:
// Q4_K 26 against 20 GB/s, Q6_K 32 against 24, one step of Qwen3-8B 0.89x the time).
constexpr int64_t chunk_blocks(int mt, int64_t x_bytes) { return std::max<int64_t>(RUN, x_bytes / (mt * QK) / RUN * RUN); }

// A row's running float sums against one weight row, as the Dot's steps hold them: lane j of a run's first 8 blocks'
// sum takes block j of every run, lane j of its last 8 blocks' block 8 + j (an AVX-512 step updates both as one
// 16-lane vector, an AVX2 step one of them). The two are added at the end, so every ISA does the same float steps in
// the same order.
template <typename Dot>
struct RunSums {
  using V = typename Dot::V;
  static constexpr int64_t STEPS = RUN / Dot::BLOCKS;
  struct F { typename V::F step[STEPS]; };
  static F zero() {
    F s;
    for (auto& v : s.step) v = V::zero();
    return s;
  }
  static float sum(const F& s) {
    __m256 eights[2];
    for (int64_t p = 0; p < STEPS; p++) V::to_eights(s.step[p], eights + p * (Dot::BLOCKS / GROUP));
    return F256::sum(_mm256_add_ps(eights[0], eights[1]));
  }
};

// The quants of the segment (a chunk of one weight row) that a pass takes next, from its chunk's first run; where
// that is a row's first chunk, the lines of the row's scales (and mins) are asked for now.
template <typename Format>
const uint8_t* next_segment(const uint8_t* row, int64_t b0, int64_t blocks) {
  const uint8_t* quants = RowLayout<Format>(row, blocks).quants;
  if (b0 == 0) prefetch_row(row, quants - row);
  return quants + b0 * Format::QUANT_BYTES;
}

// Rows [m, m + MT) of x against blocks [b0, b1) of one weight row (b0 a multiple of RUN), added to sums: MT dot
// products sharing each unpacked weight step. A step of BLOCKS blocks: BLOCKS int32 sums, one conversion, a
// multiply-add by the scales (and one by the mins), at the step's width. Each run asks for the same run of the next
// segment (next_quants): the lines come one segment ahead, a few at a time, and where `far`, FAR_AHEAD on into L2.
// Asking for a whole row at its start (2 KiB ahead) left a one-stream Qwen3-8B step 12% slower on Zen 4, its
// 8-stream step 15%.
template <typename Dot, typename Format, int MT>
void dot_rows(const RowLayout<Format>& w, const uint8_t* next_quants, bool far, const inferplug_isa::QuantizedRows& x,
              int64_t m, int64_t b0, int64_t b1, int64_t blocks, typename RunSums<Dot>::F* sums) {
  using V = typename Dot::V;
  constexpr int64_t GROUPS = Dot::BLOCKS / GROUP, STEPS = RunSums<Dot>::STEPS;
  static_assert(V::LANES == Dot::BLOCKS, "a float lane a block");
  typename V::F acc[MT][STEPS];  // in registers while the blocks pass
  for (int i = 0; i < MT; i++)
    for (int p = 0; p < STEPS; p++) acc[i][p] = sums[i].step[p];
  for (int64_t run = b0; run < b1; run += RUN) {
    const int64_t in_run = std::min(RUN, blocks - run);
    prefetch_row(next_quants + (run - b0) * Format::QUANT_BYTES, RUN * Format::QUANT_BYTES);
    if (far) prefetch_row<true>(w.quants + run * Format::QUANT_BYTES + FAR_AHEAD, RUN * Format::QUANT_BYTES);
    for (int p = 0; p < STEPS && p * Dot::BLOCKS < in_run; p++) {
      const int64_t h = p * Dot::BLOCKS, n = std::min(Dot::BLOCKS, in_run - h), groups = (n + GROUP - 1) / GROUP;
      const auto q = Dot::template load<Format>(w.quants + run * Format::QUANT_BYTES + WORD * h, WORD * in_run, n);
      typename V::F scales, mins;
      const auto by_groups = [&]() INFERPLUG_INLINE {
        __m256 scale[GROUPS] = {}, min[GROUPS] = {};  // zeros for a group past the row's end (its sums are 0)
        for (int g = 0; g < groups; g++) {
          const int64_t b = run + h + g * GROUP, count = std::min(GROUP, blocks - b);
          scale[g] = w.group_scales(b, count);
          if constexpr (Format::HAS_MIN) min[g] = w.group_mins(b, count);
        }
        scales = V::from_eights(scale), mins = V::from_eights(min);
      };
      if constexpr (V::LANES == 2 * GROUP && K_MINS<Format>) {  // a whole 16-block step in one vector
        if (n == Dot::BLOCKS) scales = w.step_scales(run + h), mins = w.step_mins(run + h);
        else by_groups();
      } else {
        by_groups();
      }
      [[maybe_unused]] typename V::F low_scales, high_scales;  // Q6_K: d times each half's sub-block scale, exact
      if constexpr (Format::BITS == 6) {
        low_scales = V::mul(Dot::to_float(Dot::widen_scales(w.sc_low + run + h)), scales);
        high_scales = V::mul(Dot::to_float(Dot::widen_scales(w.sc_high + run + h)), scales);
      }
      for (int i = 0; i < MT; i++) {
        const int64_t at = (m + i) * x.blocks + run + h;
        const int8_t* xq = x.q + inferplug_isa::run_at(x, m + i, run) + WORD * h;
        const auto x_scales = V::load(x.scale + at);
        if constexpr (Format::BITS == 6) {
          const auto halves = half_sums<Dot, Format>(q, xq, x.q6_low + at, x.q6_high + at);
          acc[i][p] = V::fmadd(Dot::to_float(halves.low), V::mul(low_scales, x_scales), acc[i][p]);
          acc[i][p] = V::fmadd(Dot::to_float(halves.high), V::mul(high_scales, x_scales), acc[i][p]);
        } else {
          acc[i][p] = V::fmadd(Dot::to_float(Dot::template dot<Format>(q, xq, x.qsum + at)), V::mul(scales, x_scales), acc[i][p]);
        }
        if constexpr (Format::HAS_MIN) acc[i][p] = V::fmadd(mins, V::load(x.sum + at), acc[i][p]);
      }
    }
  }
  for (int i = 0; i < MT; i++)
    for (int p = 0; p < STEPS; p++) sums[i].step[p] = acc[i][p];
}

// f(integral_constant<int, rows>) for 1 <= rows <= MT: the row count as a compile-time constant.
template <int MT, typename F>
void with_rows(int64_t rows, const F& f) {
  if constexpr (MT > 1) {
    if (rows < MT) return with_rows<MT - 1>(rows, f);
  }
  f(std::integral_constant<int, MT>{});
}

// Moves (n, b0) to the segment that passes over rows [n0, n1) take after row n's chunk at block b0: the next row's,
// else the pass's first row's next chunk, else the next pass's first row (past n1: the caller's next tile, as
// over_tiles hands them out).
inline void step_segment(int64_t n0, int64_t n1, int64_t chunk, int64_t blocks, int64_t& n, int64_t& b0) {
  const int64_t p0 = n0 + (n - n0) / PASS_ROWS * PASS_ROWS, p1 = std::min(n1, p0 + PASS_ROWS);
  if (n + 1 < p1) {
    n++;
  } else if (b0 + chunk < blocks) {
    n = p0;
    b0 += chunk;
  } else {
    n = p1;
    b0 = 0;
  }
}

// y[i * y_stride + n - n0] for weight rows [n0, n1), by passes of PASS_ROWS, each pass over x's blocks `chunk` at a
// time: dot(row, b0, b1, sums, next_row, next_b0, far) adds blocks [b0, b1) of a row to its MT sums (V vectors,
// from zero), which end as their lanes' sums, and asks for the lines of the segment at block next_b0 of next_row:
// the next one, or the one after it where the rows are cut in chunks. Those segments are short (32 blocks at 8 rows
// of x: 600 B of Q4_K), and an 8-stream Qwen3-8B step took 0.95-0.96x the time asking two ahead. far: whole rows of
// LONG_ROW_BYTES or more, also asked for FAR_AHEAD on.
template <typename V, int MT, typename Dot>
void by_passes(const inferplug_isa::WeightRows& w, int64_t n0, int64_t n1, int64_t chunk, float* y, int64_t y_stride,
               const Dot& dot) {
  const bool whole_rows = chunk >= w.blocks, far = whole_rows && w.row_bytes >= LONG_ROW_BYTES;
  const int64_t ahead = whole_rows ? 1 : 2;  // segments
  for (int64_t p0 = n0; p0 < n1; p0 += PASS_ROWS) {
    const int64_t p1 = std::min(n1, p0 + PASS_ROWS);
    typename V::F sums[PASS_ROWS][MT];
    for (auto& row : sums)
      for (auto& s : row) s = V::zero();
    for (int64_t b0 = 0; b0 < w.blocks; b0 += chunk)
      for (int64_t n = p0; n < p1; n++) {
        int64_t next_n = n, next_b0 = b0;
        for (int64_t k = 0; k < ahead && next_n < n1; k++)
          step_segment(n0, n1, chunk, w.blocks, next_n, next_b0);
        dot(w.data + n * w.row_bytes, b0, std::min(w.blocks, b0 + chunk), sums[n - p0], w.data + next_n * w.row_bytes, next_b0,
            far);
      }
    for (int64_t n = p0; n < p1; n++)
      for (int i = 0; i < MT; i++) y[i * y_stride + n - n0] = V::sum(sums[n - p0][i]);
  }
}

template <typename Dot, typename Format>
void quant_matmul_rows(const inferplug_isa::WeightRows& w, int64_t n0, int64_t n1, const inferplug_isa::QuantizedRows& x,
                       int64_t m, int64_t rows, float* y, int64_t y_stride) {
  with_rows<inferplug_isa::MAX_ROWS>(rows, [&](auto mt) {
    constexpr int MT = decltype(mt)::value;
    // x's later slices find the tile in L2 (over_tiles), where a smaller chunk costs more than it saves. An MoE's x
    // holds all of a step's pairs: measured there too (a 32-stream Qwen3-30B-A3B step 3% faster than with 8 KiB).
    const int64_t chunk = chunk_blocks(MT, MT <= 2 || x.rows > inferplug_isa::MAX_ROWS ? 16384 : 8192);
    by_passes<RunSums<Dot>, MT>(w, n0, n1, chunk, y, y_stride,
                                [&](const uint8_t* row, int64_t b0, int64_t b1, typename RunSums<Dot>::F* sums,
                                    const uint8_t* next_row, int64_t next_b0, bool far) {
      dot_rows<Dot, Format, MT>(RowLayout<Format>(row, w.blocks), next_segment<Format>(next_row, next_b0, w.blocks), far,
                                x, m, b0, b1, w.blocks, sums);
    });
  });
}

// The decode rows' integer matmuls, every format, for a Dot policy (an ISA's table entry).
template <typename Dot>
inferplug_isa::QuantKernels quant_kernels() {
  return {&quant_matmul_rows<Dot, Q4_1>, &quant_matmul_rows<Dot, Q4_G128>, &quant_matmul_rows<Dot, Q4_K>,
          &quant_matmul_rows<Dot, Q5_K>, &quant_matmul_rows<Dot, Q6_K>, &quant_matmul_rows<Dot, Q8_0>,
          &quant_matmul_rows<Dot, MXFP4>, &quant_matmul_rows<Dot, Q5_0>};
}

}  // namespace
