// y = x @ w.T with w in GGUF's Q4_1, Q4_K, Q5_K, Q6_K or Q8_0 blocks (or Q4_1 blocks sharing a scale per 128 inputs, Q4_G128) and x quantized per 32 inputs to int8 (llama.cpp's
// Q4_1 x Q8_1 and Q8_0 x Q8_0 dot products): integer multiply-adds on 32 weights at a time instead of
// unpacking them to floats.
//
// A weight row keeps GGUF's bytes but regroups them: all its fp16 scales, then (Q4_1) all its fp16 mins (Q4_K, Q5_K: their
// super-blocks' d and dmin, then their blocks' 6-bit codes a byte each; block_formats.h),
// then all its quants, by runs of 16 blocks with their 4-byte words interleaved (kernels.h). Blocks go 8
// (or 16) at a time: one instruction converts 8 scales, each block's integer dot product lands in its own
// lane, and the 8 blocks take a single float multiply-add.
// Prefill rows (q4_prefill_matmul / q8_prefill_matmul) keep x float32 or bf16 against panels of dequantized
// weights instead (prefill_gemm.h).
// This file checks, quantizes x and splits the work over threads; the inner loops are quant_dot.h's and
// prefill_gemm.h's, in the chosen ISA's table (kernels.h).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
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

// x quantized (kernels.h's QuantizedRows), owning its buffers. Computed here, once for every ISA, so every
// ISA multiplies the same int8 values.
struct QuantizedX {
  int64_t blocks;
  std::vector<int8_t> q;
  std::vector<float> scale, sum;
  std::vector<int32_t> qsum, qsum_low;
  inferplug_isa::QuantizedRows view() const {
    return {blocks, q.data(), scale.data(), sum.data(), qsum.data(), qsum_low.data()};
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

// order (k entries, or null): quantize x[:, order] instead of x, gathering each block's 32 inputs on the way (a
// GPTQ act-order weight's inputs, permuted at load), so no permuted copy of x is made.
QuantizedX quantize_rows(const float* x, int64_t rows, int64_t k, const int64_t* order) {
  const int64_t blocks = k / QK, width = padded(blocks);
  QuantizedX out{width, std::vector<int8_t>(rows * width * QK), std::vector<float>(rows * width), std::vector<float>(rows * width),
                 std::vector<int32_t>(rows * width), std::vector<int32_t>(rows * width)};
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
        const int64_t run = b / inferplug_isa::RUN * inferplug_isa::RUN;
        int low_sum;
        const int sum =
            quantize_block(src, max, out.q.data() + (m * width + run) * QK + (b - run) * inferplug_isa::WORD, low_sum);
        out.scale[m * width + b] = max / 127.f;
        out.sum[m * width + b] = max / 127.f * static_cast<float>(sum);
        out.qsum[m * width + b] = sum;
        out.qsum_low[m * width + b] = low_sum;
      }
    }
  });
  return out;
}

// Calls tile(n0, n1, m, rows) for tiles of 16 weight rows and every slice [m, m + rows) of x's M rows,
// rows <= MAX_ROWS. A tile stays in L2 while every slice of x passes over it.
template <typename Tile>
void over_tiles(int64_t M, int64_t N, const Tile& tile) {
  constexpr int64_t ROWS_PER_TILE = 16;
  at::parallel_for(0, (N + ROWS_PER_TILE - 1) / ROWS_PER_TILE, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t n0 = t0 * ROWS_PER_TILE; n0 < std::min(N, t1 * ROWS_PER_TILE); n0 += ROWS_PER_TILE) {
      const int64_t n1 = std::min(N, n0 + ROWS_PER_TILE);
      for (int64_t m = 0; m < M; m += inferplug_isa::MAX_ROWS) tile(n0, n1, m, std::min(inferplug_isa::MAX_ROWS, M - m));
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
  else return table.q8;
}

template <typename Format>
int64_t check_operands(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "quantized matmul: x must be a contiguous float32 [M, K] matrix");
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kByte && weight.is_contiguous(), "quantized matmul: weight must be contiguous uint8 rows of blocks [N, K / 32 * block bytes]");
  const int64_t blocks = x.size(1) / QK;
  TORCH_CHECK(x.size(1) % QK == 0 && blocks == RowLayout<Format>::blocks_in(weight.size(1)) &&
                  weight.size(1) == RowLayout<Format>::bytes(blocks),
              "quantized matmul: K must be a multiple of 32 (of 128 for Q4_G128, 256 for Q4_K, Q5_K and Q6_K) and match the weight's blocks");
  return blocks;
}

// The input order's entries must be in range (a wrong one would read outside x); checked once a call.
const int64_t* checked_order(const std::optional<at::Tensor>& order, int64_t k) {
  if (!order) return nullptr;
  TORCH_CHECK(order->scalar_type() == at::kLong && order->is_contiguous() && order->numel() == k,
              "quantized matmul: an input order must be a contiguous int64 permutation of the weight's ", k, " inputs");
  const int64_t* index = order->data_ptr<int64_t>();
  TORCH_CHECK(std::all_of(index, index + k, [k](int64_t j) { return j >= 0 && j < k; }),
              "quantized matmul: an input order entry is outside 0..", k - 1);
  return index;
}

// order: y = x[:, order] @ w.T (a GPTQ act-order weight), without the permuted copy of x.
template <typename Format>
at::Tensor quant_matmul(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& order) {
  const int64_t blocks = check_operands<Format>(x, weight), M = x.size(0), N = weight.size(0);
  const QuantizedX xq = quantize_rows(x.data_ptr<float>(), M, x.size(1), checked_order(order, x.size(1)));
  at::Tensor y = at::empty({M, N}, x.options());
  const inferplug_isa::WeightRows w{weight.data_ptr<uint8_t>(), weight.size(1), blocks};
  const auto& isa = inferplug_isa::active();
  const auto kernel = for_format<Format>(isa.quant);
  float* out = y.data_ptr<float>();
  over_tiles(M, N, [&](int64_t n0, int64_t n1, int64_t m, int64_t rows) { kernel(w, n0, n1, xq.view(), m, rows, out + m * N + n0, N); });
  return y;
}

// The lm_head: Q8_0 weights against float x, which is not rounded to int8 (its logits pick every token).
at::Tensor q8_matmul_float(const at::Tensor& x, const at::Tensor& weight) {
  const int64_t blocks = check_operands<Q8_0>(x, weight), M = x.size(0), K = x.size(1), N = weight.size(0);
  at::Tensor y = at::empty({M, N}, x.options());
  const inferplug_isa::WeightRows w{weight.data_ptr<uint8_t>(), weight.size(1), blocks};
  const auto kernel = inferplug_isa::active().q8_float;
  const float* xs = x.data_ptr<float>();
  float* out = y.data_ptr<float>();
  over_tiles(M, N, [&](int64_t n0, int64_t n1, int64_t m, int64_t rows) { kernel(w, n0, n1, xs + m * K, K, rows, out + m * N + n0, N); });
  return y;
}

// Prefill rows: float x against the weights dequantized a panel at a time (prefill_gemm.h), in float32 or bf16.
template <typename Format>
at::Tensor prefill_matmul(const at::Tensor& x, const at::Tensor& weight, const std::string& precision) {
  TORCH_CHECK(precision == "float32" || precision == "bfloat16", "prefill matmul: precision must be float32 or bfloat16, got '",
              precision, "'");
  check_operands<Format>(x, weight);
  const int64_t M = x.size(0), N = weight.size(0);
  at::Tensor y = at::empty({M, N}, x.options());
  const inferplug_isa::WeightRows w{weight.data_ptr<uint8_t>(), weight.size(1), RowLayout<Format>::blocks_in(weight.size(1))};
  const auto& isa = inferplug_isa::active();
  const auto& kernels = precision == "bfloat16" ? isa.prefill_bfloat16 : isa.prefill_float32;
  const auto kernel = for_format<Format>(kernels);
  // Narrower panels where wide ones would leave a thread idle; the width changes no result (prefill_gemm.h).
  const int64_t cols = N >= 4 * at::get_num_threads() * inferplug_isa::PREFILL_COLS ? inferplug_isa::PREFILL_COLS : 64;
  using inferplug_isa::PrefillInput;
  const at::Tensor input = kernels.input == PrefillInput::FLOAT32            ? x
                           : kernels.input == PrefillInput::ROUNDED_BFLOAT16 ? x.to(at::kBFloat16).to(at::kFloat)
                                                                             : x.to(at::kBFloat16);
  const void* xs = input.data_ptr();
  float* out = y.data_ptr<float>();
  at::parallel_for(0, (N + cols - 1) / cols, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; t++) kernel(w, t * cols, std::min(N, (t + 1) * cols), xs, M, out + t * cols, N);
  });
  return y;
}

// How the bf16 prefill multiplies here: "vdpbf16ps" (AVX512_BF16), or "fma" on bf16-rounded floats.
std::string bfloat16_dot() {
  return inferplug_isa::active().prefill_bfloat16.input == inferplug_isa::PrefillInput::BFLOAT16 ? "vdpbf16ps" : "fma";
}

// The weight [N, K] in float32 (the reference the prefill kernels are tested against) or, with bfloat16, rounded
// to the nearest bf16 as torch's .to(bfloat16) does (the oneDNN prefill path's panels: one pass, no float copy).
// INTERLEAVED: the layers' quants by runs (kernels.h); else each block's bytes in a row (the float head's).
template <typename Format, bool INTERLEAVED>
at::Tensor dequantize(const at::Tensor& weight, bool bfloat16) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kByte && weight.is_contiguous(),
              "dequantize: weight must be contiguous uint8 rows of blocks [N, K / 32 * block bytes]");
  const int64_t N = weight.size(0), blocks = RowLayout<Format>::blocks_in(weight.size(1));
  TORCH_CHECK(weight.size(1) == RowLayout<Format>::bytes(blocks), "dequantize: a row's bytes must be whole blocks");
  at::Tensor out = at::empty({N, blocks * QK}, weight.options().dtype(bfloat16 ? at::kBFloat16 : at::kFloat));
  const uint8_t* w = weight.data_ptr<uint8_t>();
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    float values[QK];
    for (int64_t n = n0; n < n1; n++) {
      const RowLayout<Format> row(w + n * weight.size(1), blocks);
      for (int64_t b = 0; b < blocks; b++) {
        const int64_t at = (n * blocks + b) * QK;
        if (!bfloat16) {
          unpack_block<Format, INTERLEAVED>(row, b, blocks, out.data_ptr<float>() + at);
          continue;
        }
        unpack_block<Format, INTERLEAVED>(row, b, blocks, values);
        c10::BFloat16* o = out.data_ptr<c10::BFloat16>() + at;
        for (int i = 0; i < QK; i++) o[i] = c10::BFloat16(values[i]);  // round to nearest, ties to even
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(inferplug, m) {
  m.def("q4_matmul(Tensor x, Tensor weight, Tensor? order=None) -> Tensor");
  m.def("q4_g128_matmul(Tensor x, Tensor weight, Tensor? order=None) -> Tensor");
  m.def("q4_k_matmul(Tensor x, Tensor weight, Tensor? order=None) -> Tensor");
  m.def("q5_k_matmul(Tensor x, Tensor weight, Tensor? order=None) -> Tensor");
  m.def("q6_k_matmul(Tensor x, Tensor weight, Tensor? order=None) -> Tensor");
  m.def("q8_matmul(Tensor x, Tensor weight, Tensor? order=None) -> Tensor");
  m.def("q8_matmul_float(Tensor x, Tensor weight) -> Tensor");
  m.def("q4_dequantize(Tensor weight, bool bfloat16=False) -> Tensor");
  m.def("q4_g128_dequantize(Tensor weight, bool bfloat16=False) -> Tensor");
  m.def("q4_k_dequantize(Tensor weight, bool bfloat16=False) -> Tensor");
  m.def("q5_k_dequantize(Tensor weight, bool bfloat16=False) -> Tensor");
  m.def("q6_k_dequantize(Tensor weight, bool bfloat16=False) -> Tensor");
  m.def("q8_dequantize(Tensor weight, bool bfloat16=False) -> Tensor");
  m.def("q8_dequantize_plain(Tensor weight, bool bfloat16=False) -> Tensor");
  m.def("q4_prefill_matmul(Tensor x, Tensor weight, str precision) -> Tensor");
  m.def("q4_g128_prefill_matmul(Tensor x, Tensor weight, str precision) -> Tensor");
  m.def("q4_k_prefill_matmul(Tensor x, Tensor weight, str precision) -> Tensor");
  m.def("q5_k_prefill_matmul(Tensor x, Tensor weight, str precision) -> Tensor");
  m.def("q6_k_prefill_matmul(Tensor x, Tensor weight, str precision) -> Tensor");
  m.def("q8_prefill_matmul(Tensor x, Tensor weight, str precision) -> Tensor");
  m.def("bfloat16_dot() -> str", &bfloat16_dot);
}
TORCH_LIBRARY_IMPL(inferplug, CPU, m) {
  m.impl("q4_matmul", &quant_matmul<Q4_1>);
  m.impl("q4_g128_matmul", &quant_matmul<Q4_G128>);
  m.impl("q4_k_matmul", &quant_matmul<Q4_K>);
  m.impl("q5_k_matmul", &quant_matmul<Q5_K>);
  m.impl("q6_k_matmul", &quant_matmul<Q6_K>);
  m.impl("q8_matmul", &quant_matmul<Q8_0>);
  m.impl("q8_matmul_float", &q8_matmul_float);
  m.impl("q4_dequantize", &dequantize<Q4_1, true>);
  m.impl("q4_g128_dequantize", &dequantize<Q4_G128, true>);
  m.impl("q4_k_dequantize", &dequantize<Q4_K, true>);
  m.impl("q5_k_dequantize", &dequantize<Q5_K, true>);
  m.impl("q6_k_dequantize", &dequantize<Q6_K, true>);
  m.impl("q8_dequantize", &dequantize<Q8_0, true>);
  m.impl("q8_dequantize_plain", &dequantize<Q8_0, false>);
  m.impl("q4_prefill_matmul", &prefill_matmul<Q4_1>);
  m.impl("q4_g128_prefill_matmul", &prefill_matmul<Q4_G128>);
  m.impl("q4_k_prefill_matmul", &prefill_matmul<Q4_K>);
  m.impl("q5_k_prefill_matmul", &prefill_matmul<Q5_K>);
  m.impl("q6_k_prefill_matmul", &prefill_matmul<Q6_K>);
  m.impl("q8_prefill_matmul", &prefill_matmul<Q8_0>);
}
