// x as the matmul kernels take it: quantized to int8 per block of 32 inputs (kernels.h's QuantizedRows), once a call
// for every ISA so every ISA multiplies the same values, or float32 / bf16 for the prefill kernels; and how a matmul
// splits over threads. Shared by the dense matmuls (quant_matmul.cpp) and an MoE layer's experts (moe_experts.cpp).
#pragma once
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <new>
#include <type_traits>
#include <vector>

#include "kernels.h"
#include "prefill_gemm.h"
#include "quant_dot.h"

namespace {

inline int64_t padded(int64_t blocks) { return (blocks + inferplug_isa::RUN - 1) / inferplug_isa::RUN * inferplug_isa::RUN; }

inline float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// An allocator whose buffers start on a cache line: the kernels load x's runs and 16 blocks' scales 64 bytes at a
// time, and malloc's 16-byte alignment split every such load across two lines (an 8-row matmul's time varied up to
// 1.7x from one process to the next, as the buffers happened to fall).
template <typename T>
struct LineAligned {
  using value_type = T;
  static constexpr std::align_val_t LINE{64};
  LineAligned() = default;
  template <typename U>
  LineAligned(const LineAligned<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), LINE)); }
  void deallocate(T* p, size_t) { ::operator delete(p, LINE); }
  template <typename U>
  bool operator==(const LineAligned<U>&) const { return true; }
  template <typename U>
  bool operator!=(const LineAligned<U>&) const { return false; }
};
template <typename T>
using Lines = std::vector<T, LineAligned<T>>;

// x quantized (kernels.h's QuantizedRows), owning its buffers. Computed here, once for every ISA, so every
// ISA multiplies the same int8 values.
struct QuantizedX {
  int64_t blocks, rows;
  bool by_runs;  // the values run-major (kernels.h), else row-major
  Lines<int8_t> q;
  Lines<float> scale, sum;
  Lines<int32_t> qsum, q6_low, q6_high;
  // Zeros for `rows` rows of `width` blocks (a multiple of RUN).
  static QuantizedX zeros(int64_t width, int64_t rows, bool by_runs) {
    return {width, rows, by_runs, Lines<int8_t>(rows * width * QK), Lines<float>(rows * width), Lines<float>(rows * width),
            Lines<int32_t>(rows * width), Lines<int32_t>(rows * width), Lines<int32_t>(rows * width)};
  }
  inferplug_isa::QuantizedRows view() const {
    constexpr int64_t RUN_BYTES = inferplug_isa::RUN * QK;
    return {blocks, rows, by_runs ? RUN_BYTES : blocks * QK, by_runs ? rows * RUN_BYTES : RUN_BYTES,
            q.data(), scale.data(), sum.data(), qsum.data(), q6_low.data(), q6_high.data()};
  }
};

// One block of 32 floats to int8: q = round-half-even(x * 127 / amax), its words RUN_WORDS_BYTES apart at q
// (x's runs, kernels.h); returns sum(q), and the sum of its first 16 in low_sum.
inline int quantize_block(const float* src, float amax, int8_t* q, int& low_sum) {
  const __m256 inv = _mm256_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
  __m256i v[4];
  for (int j = 0; j < 4; j++) v[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(src + 8 * j), inv));  // MXCSR: nearest-even
  const __m256i low = _mm256_add_epi32(v[0], v[1]), sum = _mm256_add_epi32(low, _mm256_add_epi32(v[2], v[3]));
  // packs interleaves the 128-bit lanes: the permute puts the 32 bytes back in order.
  const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
  const __m256i words = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), words);
  for (int k = 0; k < 8; k++) std::memcpy(q + k * inferplug_isa::RUN_WORDS_BYTES, &lanes[k], inferplug_isa::WORD);
  low_sum = static_cast<int>(F256::sum(_mm256_cvtepi32_ps(low)));  // |sum| <= 32 * 127: exact in float
  return static_cast<int>(F256::sum(_mm256_cvtepi32_ps(sum)));
}

// Where row m's int8 code of input j sits: in its block's run, word j % 32 / 4 of the block's words
// RUN_WORDS_BYTES apart, byte j % 4.
inline int64_t code_at(const inferplug_isa::QuantizedRows& x, int64_t m, int64_t j) {
  const int64_t b = j / QK;
  return inferplug_isa::run_at(x, m, b) + b % inferplug_isa::RUN * inferplug_isa::WORD +
         j % QK / inferplug_isa::WORD * inferplug_isa::RUN_WORDS_BYTES + j % inferplug_isa::WORD;
}

// order (k entries, or null): quantize x[:, order] instead of x, gathering each block's 32 inputs on the way (a
// GPTQ act-order weight's inputs, permuted at load), so no permuted copy of x is made.
QuantizedX quantize_rows(const float* x, int64_t rows, int64_t k, const int64_t* order, bool by_runs = true) {
  const int64_t blocks = k / QK, width = padded(blocks);
  QuantizedX out = QuantizedX::zeros(width, rows, by_runs);
  const inferplug_isa::QuantizedRows layout = out.view();
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  at::parallel_for(0, rows, 8, [&](int64_t m0, int64_t m1) {
    alignas(32) float gathered[QK];
    for (int64_t m = m0; m < m1; m++) {
      for (int64_t b = 0; b < blocks; b++) {
        const float* src = x + m * k + b * QK;
        if (order) {
          for (int j = 0; j < QK; j++) gathered[j] = x[m * k + order[b * QK + j]];
          src = gathered;
        }
        __m256 amax = _mm256_and_ps(_mm256_loadu_ps(src), abs_mask);
        for (int j = 1; j < 4; j++) amax = _mm256_max_ps(amax, _mm256_and_ps(_mm256_loadu_ps(src + 8 * j), abs_mask));
        const float max = hmax(amax);
        int low_sum;
        const int sum = quantize_block(src, max, out.q.data() + code_at(layout, m, b * QK), low_sum);
        out.scale[m * width + b] = max / 127.f;
        out.sum[m * width + b] = max / 127.f * static_cast<float>(sum);
        out.qsum[m * width + b] = sum;
        out.q6_low[m * width + b] = -32 * low_sum;
        out.q6_high[m * width + b] = -32 * (sum - low_sum);
      }
    }
  });
  return out;
}

// x [M, K] as 2M rows of int8 blocks: rows [0, M) its rounding (quantize_rows'), rows [M, 2M) the rounding of what
// that leaves, x - scale * q. The two rows' dot products summed see x to about 15 bits (the remainder's scale is at
// most 1/254 of the block's): the lm_head, where one int8 rounding of x cost SmolLM2 6.5 times the default path's
// KL divergence (1.1e-4 -> 7.5e-4) and two cost 6.5e-8.
QuantizedX quantize_in_two_parts(const float* x, int64_t rows, int64_t k) {
  const QuantizedX first = quantize_rows(x, rows, k, nullptr);
  std::vector<float> parts(2 * rows * k);
  std::memcpy(parts.data(), x, rows * k * sizeof(float));
  for (int64_t m = 0; m < rows; m++)
    for (int64_t j = 0; j < k; j++)
      parts[(rows + m) * k + j] = x[m * k + j] - first.scale[m * first.blocks + j / QK] * first.q[code_at(first.view(), m, j)];
  return quantize_rows(parts.data(), 2 * rows, k, nullptr);
}

// Calls tile(n0, n1, m, rows) for tiles of 16 weight rows and every slice [m, m + rows) of x's M rows,
// rows <= MAX_ROWS. A tile stays in L2 while every slice of x passes over it.
// Each thread walks its own contiguous part of the tiles, GRAB at a time, then takes what is left of the others'
// (where it starts on theirs): a thread that DRAM serves slower than the other leaves the rest to it instead of
// keeping it waiting at the end. Every tile is one thread's whole, so the split changes no result. Measured on Zen 4,
// a Qwen3-8B one-stream step 0.96-0.98x the time of the even split (libgomp's barrier wait 10% -> 2.6% of it), 8
// streams the same; a single shared counter instead (threads interleaving their tiles) was 1.00-1.48x.
template <typename Tile>
void over_tiles(int64_t M, int64_t N, const Tile& tile) {
  constexpr int64_t ROWS_PER_TILE = 16, GRAB = 2;
  struct alignas(64) Part {  // a line each: the owner's grabs do not contend with the other's
    std::atomic<int64_t> next;
    int64_t end;
  };
  const int64_t tiles = (N + ROWS_PER_TILE - 1) / ROWS_PER_TILE;
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), tiles));
  std::vector<Part> part(parts);
  for (int64_t p = 0; p < parts; p++) {
    part[p].next.store(tiles * p / parts, std::memory_order_relaxed);
    part[p].end = tiles * (p + 1) / parts;
  }
  at::parallel_for(0, parts, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; p++)
      for (int64_t k = 0; k < parts; k++) {
        Part& from = part[(p + k) % parts];
        for (int64_t t; (t = from.next.fetch_add(GRAB, std::memory_order_relaxed)) < from.end;)
          for (int64_t n0 = t * ROWS_PER_TILE; n0 < std::min(N, std::min(from.end, t + GRAB) * ROWS_PER_TILE); n0 += ROWS_PER_TILE) {
            const int64_t n1 = std::min(N, n0 + ROWS_PER_TILE);
            for (int64_t m = 0; m < M; m += inferplug_isa::MAX_ROWS) tile(n0, n1, m, std::min(inferplug_isa::MAX_ROWS, M - m));
          }
      }
  });
}

// The entry of a kernel table for Format.
template <typename Format, typename Table>
auto for_format(const Table& table) {
  if constexpr (std::is_same_v<Format, Q4_1>) return table.q4;
  else if constexpr (std::is_same_v<Format, Q4_G128>) return table.q4_g128;
  else if constexpr (std::is_same_v<Format, Q4_K>) return table.q4_k;
  else if constexpr (std::is_same_v<Format, Q5_K>) return table.q5_k;
  else if constexpr (std::is_same_v<Format, Q6_K>) return table.q6_k;
  else if constexpr (std::is_same_v<Format, MXFP4>) return table.mxfp4;
  else if constexpr (std::is_same_v<Format, Q5_0>) return table.q5_0;
  else return table.q8;
}

// The weight rows a prefill panel takes: narrower panels where wide ones would leave a thread idle; the width
// changes no result (prefill_gemm.h).
inline int64_t prefill_cols(int64_t N) {
  return N >= 4 * at::get_num_threads() * inferplug_isa::PREFILL_COLS ? inferplug_isa::PREFILL_COLS : 64;
}

// x [M, K] float32 as a prefill kernel table takes it (its `input`).
inline at::Tensor prefill_input(const at::Tensor& x, inferplug_isa::PrefillInput input) {
  using inferplug_isa::PrefillInput;
  return input == PrefillInput::FLOAT32            ? x
         : input == PrefillInput::ROUNDED_BFLOAT16 ? x.to(at::kBFloat16).to(at::kFloat)
                                                   : x.to(at::kBFloat16);
}

}  // namespace
