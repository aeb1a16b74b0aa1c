// y = x @ w.T with w in GGUF's Q4_1 or Q8_0 blocks and x quantized per 32 inputs to int8 (llama.cpp's
// Q4_1 x Q8_1 and Q8_0 x Q8_0 dot products): integer multiply-adds on 32 weights at a time instead of
// unpacking them to floats.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t QK = 32;  // weights per block

// x per block: int8 values [rows, K], and per block its scale and scale * sum(values) (for Q4_1's min
// term), stored block-major ([blocks, rows]) so a tile of rows reads them as one vector.
struct QuantizedRows {
  std::vector<int8_t> q;
  std::vector<float> scale, sum;
};

QuantizedRows quantize_rows(const float* x, int64_t rows, int64_t k) {
  const int64_t blocks = k / QK;
  QuantizedRows out{std::vector<int8_t>(rows * k), std::vector<float>(rows * blocks), std::vector<float>(rows * blocks)};
  for (int64_t m = 0; m < rows; m++) {
    for (int64_t b = 0; b < blocks; b++) {
      const float* src = x + m * k + b * QK;
      float amax = 0.f;
      for (int i = 0; i < QK; i++) amax = std::max(amax, std::fabs(src[i]));
      const float inv = amax > 0.f ? 127.f / amax : 0.f;
      int sum = 0;
      for (int i = 0; i < QK; i++) {
        const int v = static_cast<int>(std::nearbyint(src[i] * inv));
        out.q[m * k + b * QK + i] = static_cast<int8_t>(v);
        sum += v;
      }
      out.scale[b * rows + m] = amax / 127.f;
      out.sum[b * rows + m] = amax / 127.f * static_cast<float>(sum);
    }
  }
  return out;
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float half_to_float(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// A block's 32 weights as bytes for _mm256_maddubs_epi16 (unsigned) and x's bytes signed to match.
struct Q4_1 {  // fp16 scale, fp16 min, 16 bytes of nibbles (byte j: weight j low, j + 16 high): w = q * scale + min
  static constexpr int64_t BYTES = 20;
  static constexpr bool HAS_MIN = true;
  static __m256i weights(const uint8_t* block) {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 4));
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
  }
  static __m256i signed_x(__m256i x, const uint8_t*) { return x; }
  static void unpack(const uint8_t* block, float* out) {
    const float scale = half_to_float(block), min = half_to_float(block + 2);
    for (int j = 0; j < 16; j++) {
      out[j] = static_cast<float>(block[4 + j] & 0x0F) * scale + min;
      out[j + 16] = static_cast<float>(block[4 + j] >> 4) * scale + min;
    }
  }
};

struct Q8_0 {  // fp16 scale, 32 int8: w = q * scale
  static constexpr int64_t BYTES = 34;
  static constexpr bool HAS_MIN = false;
  static __m256i raw(const uint8_t* block) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2)); }
  static __m256i weights(const uint8_t* block) { const __m256i q = raw(block); return _mm256_sign_epi8(q, q); }  // |q|
  static __m256i signed_x(__m256i x, const uint8_t* block) { return _mm256_sign_epi8(x, raw(block)); }  // x * sign(q)
  static void unpack(const uint8_t* block, float* out) {
    const float scale = half_to_float(block);
    for (int j = 0; j < QK; j++) out[j] = static_cast<float>(static_cast<int8_t>(block[2 + j])) * scale;
  }
};

// Rows [m, m + MT) of x against one weight row: MT dot products sharing each unpacked weight block.
template <typename Format, int MT>
void dot_rows(const uint8_t* w, const QuantizedRows& x, int64_t m, int64_t rows, int64_t blocks, float* y, int64_t y_stride) {
  const __m256i ones = _mm256_set1_epi16(1);
  const int8_t* xq = x.q.data() + m * blocks * QK;
  __m256 acc[MT];
  float mins[MT] = {}, scales[MT];
  for (int i = 0; i < MT; i++) acc[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; b++, w += Format::BYTES) {
    const float scale = half_to_float(w);
    const float* x_scale = x.scale.data() + b * rows + m;
    for (int i = 0; i < MT; i++) scales[i] = scale * x_scale[i];
    if constexpr (Format::HAS_MIN) {
      const float min = half_to_float(w + 2);
      const float* x_sum = x.sum.data() + b * rows + m;
      for (int i = 0; i < MT; i++) mins[i] += min * x_sum[i];
    }
    const __m256i q = Format::weights(w);
    for (int i = 0; i < MT; i++) {
      const __m256i xi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + (i * blocks + b) * QK));
      const __m256i pairs = _mm256_madd_epi16(_mm256_maddubs_epi16(q, Format::signed_x(xi, w)), ones);
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pairs), _mm256_broadcast_ss(scales + i), acc[i]);
    }
  }
  for (int i = 0; i < MT; i++) y[i * y_stride] = hsum(acc[i]) + mins[i];
}

template <typename Format>
at::Tensor quant_matmul(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "quantized matmul: x must be a contiguous float32 [M, K] matrix");
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kByte && weight.is_contiguous(), "quantized matmul: weight must be contiguous uint8 blocks [N, K / 32 * block bytes]");
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0), blocks = K / QK;
  TORCH_CHECK(K % QK == 0 && weight.size(1) == blocks * Format::BYTES, "quantized matmul: K must be a multiple of 32 and match the weight's blocks");
  const QuantizedRows xq = quantize_rows(x.data_ptr<float>(), M, K);
  at::Tensor y = at::empty({M, N}, x.options());
  const uint8_t* w = weight.data_ptr<uint8_t>();
  float* out = y.data_ptr<float>();
  const int64_t row_bytes = blocks * Format::BYTES;
  // Tiles of 16 weight rows stay in L2 while every 4-row slice of x passes over them.
  constexpr int64_t ROWS_PER_TILE = 16;
  at::parallel_for(0, (N + ROWS_PER_TILE - 1) / ROWS_PER_TILE, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t n0 = t0 * ROWS_PER_TILE; n0 < std::min(N, t1 * ROWS_PER_TILE); n0 += ROWS_PER_TILE) {
      const int64_t n1 = std::min(N, n0 + ROWS_PER_TILE);
      for (int64_t m = 0; m < M; m += 4) {
        auto rows = [&](auto mt) {
          for (int64_t n = n0; n < n1; n++) dot_rows<Format, mt.value>(w + n * row_bytes, xq, m, M, blocks, out + m * N + n, N);
        };
        switch (std::min<int64_t>(4, M - m)) {
          case 4: rows(std::integral_constant<int, 4>{}); break;
          case 3: rows(std::integral_constant<int, 3>{}); break;
          case 2: rows(std::integral_constant<int, 2>{}); break;
          default: rows(std::integral_constant<int, 1>{});
        }
      }
    }
  });
  return y;
}

// The float32 weight [N, K]: prefill's many rows run faster as one float matmul than through dot_rows.
template <typename Format>
at::Tensor dequantize(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kByte && weight.is_contiguous() && weight.size(1) % Format::BYTES == 0,
              "dequantize: weight must be contiguous uint8 blocks [N, K / 32 * block bytes]");
  const int64_t N = weight.size(0), blocks = weight.size(1) / Format::BYTES;
  at::Tensor out = at::empty({N, blocks * QK}, weight.options().dtype(at::kFloat));
  const uint8_t* w = weight.data_ptr<uint8_t>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, N * blocks, 256, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; b++) Format::unpack(w + b * Format::BYTES, o + b * QK);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(inferplug, m) {
  m.def("q4_matmul(Tensor x, Tensor weight) -> Tensor");
  m.def("q8_matmul(Tensor x, Tensor weight) -> Tensor");
  m.def("q4_dequantize(Tensor weight) -> Tensor");
  m.def("q8_dequantize(Tensor weight) -> Tensor");
}
TORCH_LIBRARY_IMPL(inferplug, CPU, m) {
  m.impl("q4_matmul", &quant_matmul<Q4_1>);
  m.impl("q8_matmul", &quant_matmul<Q8_0>);
  m.impl("q4_dequantize", &dequantize<Q4_1>);
  m.impl("q8_dequantize", &dequantize<Q8_0>);
}
