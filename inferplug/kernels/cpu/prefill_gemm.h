// Prefill's many-row matmul over Q4_1 / Q4_K / Q5_0 / Q5_K / Q6_K / Q8_0 / MXFP4 weight rows (quant_matmul.cpp has the torch op): a panel of up to
// PREFILL_COLS weight rows is dequantized one K block at a time into an L2-sized buffer laid out for the
// micro-kernel, and every x row passes over it. No float copy of the whole weight, and each weight is unpacked
// once per call, whatever M. Two precisions: float32 x against float32 weights (FMAs), or both rounded to
// bf16 (AVX512_BF16's vdpbf16ps where the CPU has it; elsewhere the float kernel on bf16-rounded values).
// Sums are float32 either way.
//
// Batch invariance: an output's sum runs over K in one fixed order (k by k, or bf16 pairs, carried between K
// blocks through y exactly), whatever M, the panel width, the row's place in a tile or the thread.
// Torch-free: compiled per ISA (isa_avx2.cpp, isa_avx512.cpp).
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels.h"
#include "quant_dot.h"

namespace {

using inferplug_isa::PREFILL_K;

// Q5_K's (and Q5_0's) high bits of weights j..j + 7 (j a multiple of 8) at bit 4 of 8 int32: weight w's is bit 4 * (w / 16) + w % 16 / 4
// of byte w % 4 of the block's high word (block_formats.h).
inline __m256i five_bits_high(const uint8_t* quants, int j) {
  int32_t word;
  std::memcpy(&word, quants + 16, 4);
  const __m256i shifts = _mm256_add_epi32(_mm256_setr_epi32(0, 8, 16, 24, 1, 9, 17, 25), _mm256_set1_epi32(4 * (j / 16) + j % 16 / 4));
  return _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(word), shifts), _mm256_set1_epi32(1)), 4);
}

// The nibbles of weights j..j + 7 (j a multiple of 8), a byte each: byte i holds weight i in its low nibble and
// weight i + 16 in its high one (Q4_1's order, which Q5_K, Q6_K and MXFP4 share).
inline __m128i nibble_codes(const uint8_t* quants, int j) {
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(quants + j % 16));
  return _mm_and_si128(j < 16 ? bytes : _mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0F));
}

// One block's 32 weights as floats, 8 at a time: q * scale + min, a multiply then an add, as torch's reference
// rounds (BlockLinear._unpack; the build has no implicit FMAs).
template <typename Format>
inline void dequantize_block(const uint8_t* quants, float scale, float min, float* out) {
  const __m256 scales = _mm256_set1_ps(scale), mins = _mm256_set1_ps(min);
  for (int j = 0; j < QK; j += 8) {
    __m256i q;
    if constexpr (LOOKUP<Format>) {  // each code the index of its int8 value
      q = _mm256_cvtepi8_epi32(_mm_shuffle_epi8(mxfp4_values(), nibble_codes(quants, j)));
    } else if constexpr (Format::HAS_MIN || Format::BITS == 5) {
      q = _mm256_cvtepu8_epi32(nibble_codes(quants, j));
      if constexpr (Format::BITS == 5) q = _mm256_or_si256(q, five_bits_high(quants, j));
      if constexpr (CODE_OFFSET<Format> != 0) q = _mm256_sub_epi32(q, _mm256_set1_epi32(CODE_OFFSET<Format>));
    } else {
      q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(quants + j)));
    }
    _mm256_storeu_ps(out + j, _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(q), scales), mins));
  }
}

// One Q6_K block's 32 weights as floats, 8 at a time: (q - 32) * scale, q its low nibble (as Q4_1's) with its high
// bit pair above: weight w's pair is bits 2k, 2k + 1 of byte w % 4 of high word w / 16, k = w % 16 / 4 (quant_dot.h).
inline void dequantize_six_bits(const uint8_t* quants, float scale_low, float scale_high, float* out) {
  for (int j = 0; j < QK; j += 8) {
    const __m256i low = _mm256_cvtepu8_epi32(nibble_codes(quants, j));
    int32_t word;
    std::memcpy(&word, quants + 16 + 4 * (j / 16), 4);
    const __m256i shifts = _mm256_add_epi32(_mm256_setr_epi32(0, 8, 16, 24, 2, 10, 18, 26), _mm256_set1_epi32(2 * (j % 16 / 4)));
    const __m256i pairs = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(word), shifts), _mm256_set1_epi32(3));
    const __m256i q = _mm256_sub_epi32(_mm256_or_si256(low, _mm256_slli_epi32(pairs, 4)), _mm256_set1_epi32(32));
    _mm256_storeu_ps(out + j, _mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(j < 16 ? scale_low : scale_high)));
  }
}

// Block b of a row as 32 floats, its quants gathered from the runs' words (kernels.h).
template <typename Format>
inline void unpack_block(const RowLayout<Format>& row, int64_t b, int64_t blocks, float* out) {
  uint8_t quants[Format::QUANT_BYTES];
  block_quants<Format>(row.quants, b, blocks, quants);
  if constexpr (Format::BITS == 6) {  // each half's scale d * sc is exact in float32 (11 by 8 significant bits)
    dequantize_six_bits(quants, row.scale(b) * static_cast<float>(row.sc_low[b]),
                        row.scale(b) * static_cast<float>(row.sc_high[b]), out);
  } else {
    dequantize_block<Format>(quants, row.scale(b), row.min(b), out);
  }
}

// float32 to bf16 bits, rounding to the nearest even as torch's .to(torch.bfloat16) does (NaN stays NaN).
inline uint16_t bf16_bits(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

inline float bf16_round(float v) {
  const uint32_t bits = static_cast<uint32_t>(bf16_bits(v)) << 16;
  std::memcpy(&v, &bits, 4);
  return v;
}

// The float kernel: a panel holds weight (k, column j) at k * NR + j; an MR x NR tile of y is MR * NV vector
// sums, each k one weight vector load per NV, one broadcast of x per row, MR * NV FMAs. ROUND_BF16: the weights
// rounded to bf16 (the bf16 path on a CPU without vdpbf16ps; the op rounds x).
template <typename V, bool ROUND_BF16>
struct FloatPanel {
  static constexpr int NV = 2;
  static constexpr int64_t NR = NV * V::LANES;
  static constexpr int MR = V::LANES == 16 ? 12 : 6;  // MR * NV sums + NV weights + a broadcast: the registers
  using W = float;
  using X = float;
  static constexpr int64_t PACK_COLS = 1;
  // Blocks [k0, k0 + kc) / 32 of weight row n (count 1; 0: zeros) as column j of a micro-panel: the K block
  // unpacked whole, then stored (block by block, a 16-row AVX2 Q4_K matmul took 2.4-2.9 ms against 1.5-2.1).
  template <typename Format>
  static void pack_blocks(const inferplug_isa::WeightRows& w, int64_t n, int64_t count, int64_t k0, int64_t kc,
                          int64_t j, W* micro) {
    alignas(32) float values[PREFILL_K];
    if (count == 0) {
      std::fill_n(values, kc, 0.f);
    } else {
      const RowLayout<Format> row(w.data + n * w.row_bytes, w.blocks);
      for (int64_t at = 0; at < kc; at += QK) unpack_block<Format>(row, (k0 + at) / QK, w.blocks, values + at);
    }
    for (int64_t t = 0; t < kc; t++) micro[t * NR + j] = ROUND_BF16 ? bf16_round(values[t]) : values[t];
  }

  // y's tile (c, rows ldc apart) += x's ROWS rows (ldx apart) times the panel's kc rows; first: y starts at 0.
  template <int ROWS>
  static void tile(const X* x, int64_t ldx, int64_t kc, const W* panel, float* c, int64_t ldc, bool first) {
    typename V::F acc[ROWS][NV];
    for (int i = 0; i < ROWS; i++)
      for (int v = 0; v < NV; v++) acc[i][v] = first ? V::zero() : V::load(c + i * ldc + v * V::LANES);
    for (int64_t k = 0; k < kc; k++) {
      typename V::F w[NV];
      for (int v = 0; v < NV; v++) w[v] = V::load(panel + k * NR + v * V::LANES);
      for (int i = 0; i < ROWS; i++) {
        const auto a = V::set1(x[i * ldx + k]);
        for (int v = 0; v < NV; v++) acc[i][v] = V::fmadd(a, w[v], acc[i][v]);
      }
    }
    for (int i = 0; i < ROWS; i++)
      for (int v = 0; v < NV; v++) V::store(c + i * ldc + v * V::LANES, acc[i][v]);
  }
};

#ifdef INFERPLUG_AVX512  // isa_avx512.cpp; called only where the CPU has AVX512_BF16 (its table checks)
// vdpbf16ps: each 32-bit lane holds a bf16 pair (k, k + 1) of one column, so a panel holds weight (k, j) at
// (k / 2 * NR + j) * 2 + k % 2, and x's pair (k, k + 1) is one 32-bit broadcast. kc is even (blocks of 32).
struct Bf16Panel {
  static constexpr int NV = 2;
  static constexpr int64_t NR = NV * 16;
  static constexpr int MR = 12;
  using W = uint16_t;
  using X = uint16_t;
  static constexpr int64_t PACK_COLS = 16;
  // Blocks [k0, k0 + kc) / 32 of weight rows [n, n + count) (zeros after) as columns j..j + 15 of a micro-panel.
  // A K block lies in one run of a row's words (kernels.h): the 16 rows' words and scales are transposed first, so
  // that a vector holds one word of one block in the 16 rows' lanes; each weight is then worked out in all 16 rows
  // at once (weight()), and two weights rounded into each row's bf16 pair, one 64-byte store a pair row of the
  // panel. Transposing the words moves 4 bytes for a weight pair of 16 rows where transposing the rounded pairs (one
  // row at a time, from a 16-entry table) moved 64, and the shuffles bound the pack: on Zen 4 a one-row prefill
  // matmul, nearly all pack, 1.20x as fast as Q4_K, 1.29x as Q6_K, 1.08-1.22x as the other formats; the same bits.
  template <typename Format>
  __attribute__((target("avx512bf16"))) static void pack_blocks(const inferplug_isa::WeightRows& w, int64_t n,
                                                                int64_t count, int64_t k0, int64_t kc, int64_t j,
                                                                W* micro) {
    static_assert(RUN % (PREFILL_K / QK) == 0 && PREFILL_K / QK == GROUP, "a K block's blocks: one run's, one group");
    constexpr int WORDS = Format::QUANT_BYTES / WORD, PAIRS = (WORDS + 1) / 2;
    const int64_t b0 = k0 / QK, blocks = kc / QK, run = b0 / RUN * RUN, stride = WORD * std::min(RUN, w.blocks - run);
    const __mmask8 in_block = static_cast<__mmask8>((1u << blocks) - 1);
    // lane l of row c: words[i][c] word 2i (l < 8) or 2i + 1 of block l % 8; values[c] block l's first value (its
    // scale; Q6_K: its low half's) or (l >= 8) its second (its min, or 0; Q6_K: its high half's scale)
    __m512i words[PAIRS][16], values[16];
    for (int64_t c = 0; c < 16; c++) {
      if (c >= count) {
        for (auto& pair : words) pair[c] = _mm512_setzero_si512();
        values[c] = _mm512_setzero_si512();
        continue;
      }
      const uint8_t* bytes = w.data + (n + c) * w.row_bytes;
      if (k0 == 0) prefetch_row(bytes + 16 * w.row_bytes, w.row_bytes);  // the next call's row, from DRAM
      const RowLayout<Format> row(bytes, w.blocks);
      const uint8_t* quants = row.quants + run * Format::QUANT_BYTES + (b0 - run) * WORD;
      const auto word = [&](int k) {  // word k of the K block's blocks
        return k < WORDS ? _mm256_maskz_loadu_epi32(in_block, quants + k * stride) : _mm256_setzero_si256();
      };
      for (int i = 0; i < PAIRS; i++) words[i][c] = _mm512_inserti64x4(_mm512_castsi256_si512(word(2 * i)), word(2 * i + 1), 1);
      const __m256 scales = row.group_scales(b0, blocks);
      __m256 first = scales, second = Format::HAS_MIN ? row.group_mins(b0, blocks) : _mm256_setzero_ps();
      if constexpr (Format::BITS == 6)  // d times each half's sub-block scale, exact
        first = _mm256_mul_ps(scales, widened(row.sc_low + b0)), second = _mm256_mul_ps(scales, widened(row.sc_high + b0));
      values[c] = _mm512_castps_si512(_mm512_insertf32x8(_mm512_castps256_ps512(first), second, 1));
    }
    for (auto& pair : words) transpose(pair);
    transpose(values);
    alignas(64) static const uint16_t pair_order[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                                        8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i interleave = _mm512_load_si512(pair_order);  // 16 values of weight 2p, then 2p + 1's, into 16 pairs
    for (int64_t t = 0; t < blocks; t++) {
      const __m512 first = _mm512_castsi512_ps(values[t]), second = _mm512_castsi512_ps(values[8 + t]);
      const auto word = [&](int k) { return words[k / 2][k % 2 * 8 + t]; };
#pragma GCC unroll 16
      for (int p = 0; p < 16; p++) {
        const auto bf16 = (__m512i)_mm512_cvtne2ps_pbh(weight<Format>(word, 2 * p + 1, first, second),
                                                        weight<Format>(word, 2 * p, first, second));
        _mm512_storeu_si512(micro + ((t * QK / 2 + p) * NR + j) * 2, _mm512_permutexvar_epi16(interleave, bf16));
      }
    }
  }
  // Weight i of a block in 16 rows' lanes, from its words in those lanes (word(k)) and the block's two values: its
  // code q (Q4_1's nibble order, with Q5's high bit or Q6_K's high bit pair above it; Q8_0's signed byte; MXFP4's
  // looked-up value) times the first plus the second (Q6_K: (q - 32) times its half's scale), a multiply then an
  // add as BlockLinear._unpack rounds them (the build has no implicit FMAs).
  template <typename Format, typename Word>
  INFERPLUG_INLINE static __m512 weight(const Word& word, int i, __m512 first, __m512 second) {
    const auto bits = [&](int k, int at, int mask) {
      return _mm512_and_si512(_mm512_srli_epi32(word(k), at), _mm512_set1_epi32(mask));
    };
    const int half = i / 16, byte = i % 16;  // a 4-bit code: the low (half 0) or high nibble of byte i % 16
    __m512i q;
    if constexpr (Format::BITS == 8) {
      q = _mm512_srai_epi32(_mm512_slli_epi32(word(i / 4), 24 - 8 * (i % 4)), 24);
    } else {
      q = bits(byte / 4, 8 * (byte % 4) + 4 * half, 0x0F);
      if constexpr (LOOKUP<Format>) {  // the code's value, a float already
        const __m512 value = _mm512_permutexvar_ps(q, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(mxfp4_values())));
        return _mm512_add_ps(_mm512_mul_ps(value, first), second);
      }
      if constexpr (Format::BITS == 5)  // bit 4 * half + byte / 4 of byte byte % 4 of word 4 (five_bits_high)
        q = _mm512_or_si512(q, _mm512_slli_epi32(bits(4, 8 * (byte % 4) + 4 * half + byte / 4, 1), 4));
      if constexpr (Format::BITS == 6) {  // bits 2 * (byte / 4) of byte byte % 4 of word 4 + half
        q = _mm512_or_si512(q, _mm512_slli_epi32(bits(4 + half, 8 * (byte % 4) + 2 * (byte / 4), 3), 4));
        return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(q, _mm512_set1_epi32(32))), half ? second : first);
      }
      if constexpr (CODE_OFFSET<Format> != 0) q = _mm512_sub_epi32(q, _mm512_set1_epi32(CODE_OFFSET<Format>));
    }
    return _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(q), first), second);
  }
  // 8 int8 codes as floats.
  static __m256 widened(const int8_t* codes) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes))));
  }
  // r[c][t] -> r[t][c] for 16 x 16 32-bit lanes: pairs within 128-bit lanes, then quads, then the 128-bit lanes.
  static void transpose(__m512i* r) {
    __m512i a[16], b[16];
    for (int i = 0; i < 8; i++) {  // a[2i]: rows 2i, 2i + 1 interleaved, elements 0, 1 of each lane; a[2i + 1]: 2, 3
      a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
      a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {  // b[4i + e], lane L: rows 4i..4i + 3, element 4L + e
      b[4 * i] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
      b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
      b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
      b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
    }
    for (int e = 0; e < 4; e++) {  // row 4L + e: lane L of b[e], b[4 + e], b[8 + e], b[12 + e]
      const __m512i v0 = _mm512_shuffle_i32x4(b[e], b[4 + e], 0x44), v1 = _mm512_shuffle_i32x4(b[e], b[4 + e], 0xEE);
      const __m512i v2 = _mm512_shuffle_i32x4(b[8 + e], b[12 + e], 0x44), v3 = _mm512_shuffle_i32x4(b[8 + e], b[12 + e], 0xEE);
      r[e] = _mm512_shuffle_i32x4(v0, v2, 0x88);
      r[4 + e] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
      r[8 + e] = _mm512_shuffle_i32x4(v1, v3, 0x88);
      r[12 + e] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
    }
  }

  template <int ROWS>
  __attribute__((target("avx512bf16"))) static void tile(const X* x, int64_t ldx, int64_t kc, const W* panel,
                                                         float* c, int64_t ldc, bool first) {
    __m512 acc[ROWS][NV];
    for (int i = 0; i < ROWS; i++)
      for (int v = 0; v < NV; v++) acc[i][v] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c + i * ldc + v * 16);
    for (int64_t p = 0; p < kc / 2; p++) {
      __m512bh w[NV];
      for (int v = 0; v < NV; v++) w[v] = (__m512bh)_mm512_loadu_si512(panel + (p * NR + v * 16) * 2);
      for (int i = 0; i < ROWS; i++) {
        int32_t pair;
        std::memcpy(&pair, x + i * ldx + 2 * p, 4);
        const __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
        for (int v = 0; v < NV; v++) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], a, w[v]);
      }
    }
    for (int i = 0; i < ROWS; i++)
      for (int v = 0; v < NV; v++) _mm512_storeu_ps(c + i * ldc + v * 16, acc[i][v]);
  }
};
#endif

// y[m * y_stride + n - n0] = x[m] . w[n] for weight rows [n0, n1), n1 - n0 <= PREFILL_COLS, and all M rows of x
// ([M, K] of Panel::X); y points at column n0 of row 0.
template <typename Panel, typename Format>
void prefill_matmul_cols(const inferplug_isa::WeightRows& w, int64_t n0, int64_t n1, const void* input, int64_t M,
                         float* y, int64_t y_stride) {
  using W = typename Panel::W;
  constexpr int64_t NR = Panel::NR;
  constexpr int MR = Panel::MR;
  const int64_t K = w.blocks * QK, cols = n1 - n0, panels = (cols + NR - 1) / NR;
  // Micro-panel p (NR columns) at p * NR * kc; on the stack (128 KiB at most): a std::vector's exception paths
  // would give this file a weak symbol (tests/kernels/cpu/test_isa.py).
  static_assert(inferplug_isa::PREFILL_COLS % NR == 0, "a panel holds whole micro-panels");
  alignas(64) W panel[inferplug_isa::PREFILL_COLS * PREFILL_K];
  const auto* x = static_cast<const typename Panel::X*>(input);
  alignas(64) float edge[MR * NR];  // the last micro-panel's tile where fewer than NR columns remain
  constexpr int64_t PACK_COLS = Panel::PACK_COLS;
  static_assert(NR % PACK_COLS == 0, "a pack's columns sit in one micro-panel");
  for (int64_t k0 = 0; k0 < K; k0 += PREFILL_K) {
    const int64_t kc = std::min(PREFILL_K, K - k0);
    for (int64_t j0 = 0; j0 < panels * NR; j0 += PACK_COLS)  // column j of the panel: weight row n0 + j, zeros past n1
      Panel::template pack_blocks<Format>(w, n0 + j0, std::clamp<int64_t>(cols - j0, 0, PACK_COLS), k0, kc, j0 % NR,
                                          panel + j0 / NR * NR * kc);
    for (int64_t m = 0; m < M; m += MR) {
      const int64_t rows = std::min<int64_t>(MR, M - m);
      const auto* xs = x + m * K + k0;
      with_rows<MR>(rows, [&](auto r) {
        constexpr int ROWS = decltype(r)::value;
        for (int64_t p = 0; p < panels; p++) {
          float* c = y + m * y_stride + p * NR;
          const W* micro = panel + p * NR * kc;
          const int64_t width = std::min(NR, cols - p * NR);
          if (width == NR) {
            Panel::template tile<ROWS>(xs, K, kc, micro, c, y_stride, k0 == 0);
            continue;
          }
          for (int i = 0; i < ROWS && k0 > 0; i++) std::memcpy(edge + i * NR, c + i * y_stride, width * 4);
          Panel::template tile<ROWS>(xs, K, kc, micro, edge, NR, k0 == 0);
          for (int i = 0; i < ROWS; i++) std::memcpy(c + i * y_stride, edge + i * NR, width * 4);
        }
      });
    }
  }
}

// One precision's prefill kernels, every format, for a Panel (an ISA's table entry).
template <typename Panel>
inferplug_isa::PrefillKernels prefill_kernels(inferplug_isa::PrefillInput input) {
  return {&prefill_matmul_cols<Panel, Q4_1>, &prefill_matmul_cols<Panel, Q4_G128>, &prefill_matmul_cols<Panel, Q4_K>,
          &prefill_matmul_cols<Panel, Q5_K>, &prefill_matmul_cols<Panel, Q6_K>, &prefill_matmul_cols<Panel, Q8_0>,
          &prefill_matmul_cols<Panel, MXFP4>, &prefill_matmul_cols<Panel, Q5_0>, input};
}

}  // namespace
