// y = x @ w.T with w in GGUF's Q4_1 or Q8_0 blocks and x quantized per 32 inputs to int8 (llama.cpp's
// Q4_1 x Q8_1 and Q8_0 x Q8_0 dot products): integer multiply-adds on 32 weights at a time instead of
// unpacking them to floats.
//
// A weight row keeps GGUF's bytes but regroups them: all its fp16 scales, then (Q4_1) all its fp16 mins,
// then all its quants. Blocks go 8 at a time: one instruction converts 8 scales, and the 8 blocks'
// integer dot products are summed into one vector before a single float multiply-add.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "vec_math.h"

namespace {

constexpr int64_t QK = 32;    // weights per block
constexpr int64_t GROUP = 8;  // blocks per step: one AVX2 vector of their scales
constexpr int64_t PREFETCH = 2048;  // bytes ahead

inline int64_t padded(int64_t blocks) { return (blocks + GROUP - 1) / GROUP * GROUP; }

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The n <= 8 fp16 values at p as floats, zeros past n.
inline __m256 load_halves(const uint8_t* p, int64_t n) {
  if (n == GROUP) return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  uint16_t bits[GROUP] = {};
  std::memcpy(bits, p, n * 2);
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bits)));
}

// x per block: int8 values, its scale and scale * sum(values) (for Q4_1's min term); row-major, each row
// padded with zero blocks to a whole number of groups.
struct QuantizedRows {
  int64_t blocks;  // per row, padded
  std::vector<int8_t> q;
  std::vector<float> scale, sum;
};

// One block of 32 floats to int8: q = round-half-even(x * 127 / amax); returns sum(q).
inline int quantize_block(const float* src, float amax, int8_t* q) {
  const __m256 inv = _mm256_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
  __m256i v[4];
  for (int j = 0; j < 4; j++) v[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(src + 8 * j), inv));  // MXCSR: nearest-even
  const __m256i sum = _mm256_add_epi32(_mm256_add_epi32(v[0], v[1]), _mm256_add_epi32(v[2], v[3]));
  // packs interleaves the 128-bit lanes: the permute puts the 32 bytes back in order.
  const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  return static_cast<int>(hsum(_mm256_cvtepi32_ps(sum)));
}

QuantizedRows quantize_rows(const float* x, int64_t rows, int64_t k) {
  const int64_t blocks = k / QK, width = padded(blocks);
  QuantizedRows out{width, std::vector<int8_t>(rows * width * QK), std::vector<float>(rows * width), std::vector<float>(rows * width)};
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  at::parallel_for(0, rows, 8, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; m++) {
      for (int64_t b = 0; b < blocks; b++) {
        const float* src = x + m * k + b * QK;
        __m256 amax = _mm256_and_ps(_mm256_loadu_ps(src), abs_mask);
        for (int j = 1; j < 4; j++) amax = _mm256_max_ps(amax, _mm256_and_ps(_mm256_loadu_ps(src + 8 * j), abs_mask));
        const float max = hmax(amax);
        const int sum = quantize_block(src, max, out.q.data() + (m * width + b) * QK);
        out.scale[m * width + b] = max / 127.f;
        out.sum[m * width + b] = max / 127.f * static_cast<float>(sum);
      }
    }
  });
  return out;
}

// Per format: the bytes of a block's quants, whether it has mins, and its 32 weights as bytes for
// _mm256_maddubs_epi16 (unsigned) with x's bytes signed to match.
struct Q4_1 {  // w = q * scale + min, q in 0..15; 16 bytes of nibbles (byte j: weight j low, j + 16 high)
  static constexpr int64_t QUANT_BYTES = 16;
  static constexpr bool HAS_MIN = true;
  static __m256i weights(const uint8_t* quants) {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(quants));
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
  }
  static __m256i signed_x(__m256i x, const uint8_t*) { return x; }
  static float weight(const uint8_t* quants, int j) { return static_cast<float>(j < 16 ? quants[j] & 0x0F : quants[j - 16] >> 4); }
};

struct Q8_0 {  // w = q * scale, 32 int8
  static constexpr int64_t QUANT_BYTES = 32;
  static constexpr bool HAS_MIN = false;
  static __m256i raw(const uint8_t* quants) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(quants)); }
  static __m256i weights(const uint8_t* quants) { const __m256i q = raw(quants); return _mm256_sign_epi8(q, q); }  // |q|
  static __m256i signed_x(__m256i x, const uint8_t* quants) { return _mm256_sign_epi8(x, raw(quants)); }  // x * sign(q)
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

// The hardware prefetcher alone leaves the cores waiting on DRAM: ask for the lines PREFETCH bytes past a row.
inline void prefetch_ahead(const uint8_t* row, int64_t bytes) {
  for (int64_t at = 0; at < bytes; at += 64) _mm_prefetch(reinterpret_cast<const char*>(row + PREFETCH + at), _MM_HINT_T0);
}

// Rows [m, m + MT) of x against one weight row: MT dot products sharing each unpacked weight block.
template <typename Format, int MT>
void dot_rows(const uint8_t* row, const QuantizedRows& x, int64_t m, int64_t blocks, float* y, int64_t y_stride) {
  const RowLayout<Format> w(row, blocks);
  prefetch_ahead(row, RowLayout<Format>::bytes(blocks));
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[MT];
  for (int i = 0; i < MT; i++) acc[i] = _mm256_setzero_ps();
  auto group = [&](int64_t b, auto whole) {  // blocks [b, b + n): n = GROUP but in a row's last group
    constexpr bool WHOLE = decltype(whole)::value;
    const int64_t n = WHOLE ? GROUP : blocks - b;
    const __m256 scale = load_halves(w.scales + 2 * b, n);
    const __m256 min = Format::HAS_MIN ? load_halves(w.mins + 2 * b, n) : _mm256_setzero_ps();
    const uint8_t* quants = w.quants + b * Format::QUANT_BYTES;
    __m256i q[GROUP];
    for (int64_t j = 0; j < GROUP; j++)
      if (WHOLE || j < n) q[j] = Format::weights(quants + j * Format::QUANT_BYTES);
    for (int i = 0; i < MT; i++) {
      const int64_t at = (m + i) * x.blocks + b;
      __m256i dots[GROUP];
      for (int64_t j = 0; j < GROUP; j++) {
        const __m256i xj = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q.data() + (at + j) * QK));
        dots[j] = WHOLE || j < n ? _mm256_madd_epi16(_mm256_maddubs_epi16(q[j], Format::signed_x(xj, quants + j * Format::QUANT_BYTES)), ones)
                                 : _mm256_setzero_si256();
      }
      const __m256 scales = _mm256_mul_ps(scale, _mm256_loadu_ps(x.scale.data() + at));
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(vec::sums_of(dots)), scales, acc[i]);
      if constexpr (Format::HAS_MIN) acc[i] = _mm256_fmadd_ps(min, _mm256_loadu_ps(x.sum.data() + at), acc[i]);
    }
  };
  int64_t b = 0;
  for (; b + GROUP <= blocks; b += GROUP) group(b, std::true_type{});
  if (b < blocks) group(b, std::false_type{});
  for (int i = 0; i < MT; i++) y[i * y_stride] = hsum(acc[i]);
}

// f(integral_constant<int, rows>) for 1 <= rows <= MT: the row count as a compile-time constant.
template <int MT, typename F>
void with_rows(int64_t rows, const F& f) {
  if constexpr (MT > 1) {
    if (rows < MT) return with_rows<MT - 1>(rows, f);
  }
  f(std::integral_constant<int, MT>{});
}

// Calls tile(n, m, MT) for every weight row n and every slice [m, m + MT) of x's M rows, MT <= 4 a compile-time
// constant. Tiles of 16 weight rows stay in L2 while every slice of x passes over them.
template <typename Tile>
void over_tiles(int64_t M, int64_t N, const Tile& tile) {
  constexpr int64_t ROWS_PER_TILE = 16;
  at::parallel_for(0, (N + ROWS_PER_TILE - 1) / ROWS_PER_TILE, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t n0 = t0 * ROWS_PER_TILE; n0 < std::min(N, t1 * ROWS_PER_TILE); n0 += ROWS_PER_TILE) {
      const int64_t n1 = std::min(N, n0 + ROWS_PER_TILE);
      for (int64_t m = 0; m < M; m += 4)
        with_rows<4>(M - m, [&](auto mt) {
          for (int64_t n = n0; n < n1; n++) tile(n, m, mt);
        });
    }
  });
}

template <typename Format>
int64_t check_operands(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "quantized matmul: x must be a contiguous float32 [M, K] matrix");
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kByte && weight.is_contiguous(), "quantized matmul: weight must be contiguous uint8 rows of blocks [N, K / 32 * block bytes]");
  const int64_t blocks = x.size(1) / QK;
  TORCH_CHECK(x.size(1) % QK == 0 && weight.size(1) == RowLayout<Format>::bytes(blocks), "quantized matmul: K must be a multiple of 32 and match the weight's blocks");
  return blocks;
}

template <typename Format>
at::Tensor quant_matmul(const at::Tensor& x, const at::Tensor& weight) {
  const int64_t blocks = check_operands<Format>(x, weight), M = x.size(0), N = weight.size(0);
  const QuantizedRows xq = quantize_rows(x.data_ptr<float>(), M, x.size(1));
  at::Tensor y = at::empty({M, N}, x.options());
  const uint8_t* w = weight.data_ptr<uint8_t>();
  float* out = y.data_ptr<float>();
  over_tiles(M, N, [&](int64_t n, int64_t m, auto mt) {
    dot_rows<Format, decltype(mt)::value>(w + n * weight.size(1), xq, m, blocks, out + m * N + n, N);
  });
  return y;
}

// Rows [m, m + MT) of float x against one Q8_0 weight row, without rounding x to int8: the lm_head, whose
// logits pick every token. A block's 32 weights become floats once for all MT rows.
template <int MT>
void dot_rows_float(const uint8_t* row, const float* x, int64_t k, int64_t blocks, float* y, int64_t y_stride) {
  const RowLayout<Q8_0> w(row, blocks);
  prefetch_ahead(row, RowLayout<Q8_0>::bytes(blocks));
  __m256 acc[MT];
  for (int i = 0; i < MT; i++) acc[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; b += GROUP) {
    const int64_t n = std::min(GROUP, blocks - b);
    const __m256 scales = load_halves(w.scales + 2 * b, n);
    for (int64_t j = 0; j < n; j++) {
      const uint8_t* quants = w.quants + (b + j) * QK;
      const __m256 scale = _mm256_permutevar8x32_ps(scales, _mm256_set1_epi32(static_cast<int>(j)));
      __m256 q[4];
      for (int l = 0; l < 4; l++)
        q[l] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(quants + 8 * l))));
      for (int i = 0; i < MT; i++) {
        const float* xb = x + i * k + (b + j) * QK;
        __m256 dot = _mm256_mul_ps(q[0], _mm256_loadu_ps(xb));
        for (int l = 1; l < 4; l++) dot = _mm256_fmadd_ps(q[l], _mm256_loadu_ps(xb + 8 * l), dot);
        acc[i] = _mm256_fmadd_ps(dot, scale, acc[i]);
      }
    }
  }
  for (int i = 0; i < MT; i++) y[i * y_stride] = hsum(acc[i]);
}

at::Tensor q8_matmul_float(const at::Tensor& x, const at::Tensor& weight) {
  const int64_t blocks = check_operands<Q8_0>(x, weight), M = x.size(0), K = x.size(1), N = weight.size(0);
  at::Tensor y = at::empty({M, N}, x.options());
  const uint8_t* w = weight.data_ptr<uint8_t>();
  const float* xs = x.data_ptr<float>();
  float* out = y.data_ptr<float>();
  over_tiles(M, N, [&](int64_t n, int64_t m, auto mt) {
    dot_rows_float<decltype(mt)::value>(w + n * weight.size(1), xs + m * K, K, blocks, out + m * N + n, N);
  });
  return y;
}

// The float32 weight [N, K]: prefill's many rows run faster as one float matmul than through dot_rows.
template <typename Format>
at::Tensor dequantize(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kByte && weight.is_contiguous(),
              "dequantize: weight must be contiguous uint8 rows of blocks [N, K / 32 * block bytes]");
  const int64_t N = weight.size(0), blocks = weight.size(1) / RowLayout<Format>::bytes(1);
  TORCH_CHECK(weight.size(1) == RowLayout<Format>::bytes(blocks), "dequantize: a row's bytes must be whole blocks");
  at::Tensor out = at::empty({N, blocks * QK}, weight.options().dtype(at::kFloat));
  const uint8_t* w = weight.data_ptr<uint8_t>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; n++) {
      const RowLayout<Format> row(w + n * weight.size(1), blocks);
      for (int64_t b = 0; b < blocks; b++) {
        const float scale = _cvtsh_ss(reinterpret_cast<const uint16_t*>(row.scales)[b]);
        const float min = Format::HAS_MIN ? _cvtsh_ss(reinterpret_cast<const uint16_t*>(row.mins)[b]) : 0.f;
        for (int j = 0; j < QK; j++) o[(n * blocks + b) * QK + j] = Format::weight(row.quants + b * Format::QUANT_BYTES, j) * scale + min;
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(inferplug, m) {
  m.def("q4_matmul(Tensor x, Tensor weight) -> Tensor");
  m.def("q8_matmul(Tensor x, Tensor weight) -> Tensor");
  m.def("q8_matmul_float(Tensor x, Tensor weight) -> Tensor");
  m.def("q4_dequantize(Tensor weight) -> Tensor");
  m.def("q8_dequantize(Tensor weight) -> Tensor");
}
TORCH_LIBRARY_IMPL(inferplug, CPU, m) {
  m.impl("q4_matmul", &quant_matmul<Q4_1>);
  m.impl("q8_matmul", &quant_matmul<Q8_0>);
  m.impl("q8_matmul_float", &q8_matmul_float);
  m.impl("q4_dequantize", &dequantize<Q4_1>);
  m.impl("q8_dequantize", &dequantize<Q8_0>);
}
