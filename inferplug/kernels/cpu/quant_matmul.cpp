// y = x @ w.T with w in GGUF's Q4_1, Q4_K, Q5_0, Q5_K, Q6_K, Q8_0 or MXFP4 blocks (or Q4_1 blocks sharing a scale per 128 inputs, Q4_G128) and x quantized per 32 inputs to int8 (llama.cpp's
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
#include "matmul_input.h"

namespace {

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

// y [M, N] = xq's M rows @ w.T, the weight's rows in tiles (over_tiles).
template <typename Format>
at::Tensor matmul_quantized(const QuantizedX& xq, int64_t M, const at::Tensor& weight, int64_t blocks,
                            const at::TensorOptions& options) {
  const int64_t N = weight.size(0);
  at::Tensor y = at::empty({M, N}, options);
  const inferplug_isa::WeightRows w{weight.data_ptr<uint8_t>(), weight.size(1), blocks};
  const auto kernel = for_format<Format>(inferplug_isa::active().quant);
  float* out = y.data_ptr<float>();
  over_tiles(M, N, [&](int64_t n0, int64_t n1, int64_t m, int64_t rows) { kernel(w, n0, n1, xq.view(), m, rows, out + m * N + n0, N); });
  return y;
}

// order: y = x[:, order] @ w.T (a GPTQ act-order weight), without the permuted copy of x.
template <typename Format>
at::Tensor quant_matmul(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& order) {
  const int64_t blocks = check_operands<Format>(x, weight), M = x.size(0);
  const QuantizedX xq = quantize_rows(x.data_ptr<float>(), M, x.size(1), checked_order(order, x.size(1)));
  return matmul_quantized<Format>(xq, M, weight, blocks, x.options());
}

// The lm_head, whose logits pick every token: x in two int8 parts (quantize_in_two_parts), their products summed.
// Each row's sums are its own, whatever rows share the call.
template <typename Format>
at::Tensor head_matmul(const at::Tensor& x, const at::Tensor& weight) {
  const int64_t blocks = check_operands<Format>(x, weight), M = x.size(0);
  const at::Tensor parts = matmul_quantized<Format>(quantize_in_two_parts(x.data_ptr<float>(), M, x.size(1)), 2 * M,
                                                    weight, blocks, x.options());
  return parts.narrow(0, 0, M) + parts.narrow(0, M, M);
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
  const int64_t cols = prefill_cols(N);
  const at::Tensor input = prefill_input(x, kernels.input);
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
template <typename Format>
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
          unpack_block<Format>(row, b, blocks, out.data_ptr<float>() + at);
          continue;
        }
        unpack_block<Format>(row, b, blocks, values);
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
  m.def("q5_0_matmul(Tensor x, Tensor weight, Tensor? order=None) -> Tensor");
  m.def("q5_k_matmul(Tensor x, Tensor weight, Tensor? order=None) -> Tensor");
  m.def("q6_k_matmul(Tensor x, Tensor weight, Tensor? order=None) -> Tensor");
  m.def("q8_matmul(Tensor x, Tensor weight, Tensor? order=None) -> Tensor");
  m.def("mxfp4_matmul(Tensor x, Tensor weight, Tensor? order=None) -> Tensor");
  m.def("q6_k_head_matmul(Tensor x, Tensor weight) -> Tensor");
  m.def("q8_head_matmul(Tensor x, Tensor weight) -> Tensor");
  m.def("q4_dequantize(Tensor weight, bool bfloat16=False) -> Tensor");
  m.def("q4_g128_dequantize(Tensor weight, bool bfloat16=False) -> Tensor");
  m.def("q4_k_dequantize(Tensor weight, bool bfloat16=False) -> Tensor");
  m.def("q5_0_dequantize(Tensor weight, bool bfloat16=False) -> Tensor");
  m.def("q5_k_dequantize(Tensor weight, bool bfloat16=False) -> Tensor");
  m.def("q6_k_dequantize(Tensor weight, bool bfloat16=False) -> Tensor");
  m.def("q8_dequantize(Tensor weight, bool bfloat16=False) -> Tensor");
  m.def("mxfp4_dequantize(Tensor weight, bool bfloat16=False) -> Tensor");
  m.def("q4_prefill_matmul(Tensor x, Tensor weight, str precision) -> Tensor");
  m.def("q4_g128_prefill_matmul(Tensor x, Tensor weight, str precision) -> Tensor");
  m.def("q4_k_prefill_matmul(Tensor x, Tensor weight, str precision) -> Tensor");
  m.def("q5_0_prefill_matmul(Tensor x, Tensor weight, str precision) -> Tensor");
  m.def("q5_k_prefill_matmul(Tensor x, Tensor weight, str precision) -> Tensor");
  m.def("q6_k_prefill_matmul(Tensor x, Tensor weight, str precision) -> Tensor");
  m.def("q8_prefill_matmul(Tensor x, Tensor weight, str precision) -> Tensor");
  m.def("mxfp4_prefill_matmul(Tensor x, Tensor weight, str precision) -> Tensor");
  m.def("bfloat16_dot() -> str", &bfloat16_dot);
}
TORCH_LIBRARY_IMPL(inferplug, CPU, m) {
  m.impl("q4_matmul", &quant_matmul<Q4_1>);
  m.impl("q4_g128_matmul", &quant_matmul<Q4_G128>);
  m.impl("q4_k_matmul", &quant_matmul<Q4_K>);
  m.impl("q5_0_matmul", &quant_matmul<Q5_0>);
  m.impl("q5_k_matmul", &quant_matmul<Q5_K>);
  m.impl("q6_k_matmul", &quant_matmul<Q6_K>);
  m.impl("q8_matmul", &quant_matmul<Q8_0>);
  m.impl("mxfp4_matmul", &quant_matmul<MXFP4>);
  m.impl("q6_k_head_matmul", &head_matmul<Q6_K>);
  m.impl("q8_head_matmul", &head_matmul<Q8_0>);
  m.impl("q4_dequantize", &dequantize<Q4_1>);
  m.impl("q4_g128_dequantize", &dequantize<Q4_G128>);
  m.impl("q4_k_dequantize", &dequantize<Q4_K>);
  m.impl("q5_0_dequantize", &dequantize<Q5_0>);
  m.impl("q5_k_dequantize", &dequantize<Q5_K>);
  m.impl("q6_k_dequantize", &dequantize<Q6_K>);
  m.impl("q8_dequantize", &dequantize<Q8_0>);
  m.impl("mxfp4_dequantize", &dequantize<MXFP4>);
  m.impl("q4_prefill_matmul", &prefill_matmul<Q4_1>);
  m.impl("q4_g128_prefill_matmul", &prefill_matmul<Q4_G128>);
  m.impl("q4_k_prefill_matmul", &prefill_matmul<Q4_K>);
  m.impl("q5_0_prefill_matmul", &prefill_matmul<Q5_0>);
  m.impl("q5_k_prefill_matmul", &prefill_matmul<Q5_K>);
  m.impl("q6_k_prefill_matmul", &prefill_matmul<Q6_K>);
  m.impl("q8_prefill_matmul", &prefill_matmul<Q8_0>);
  m.impl("mxfp4_prefill_matmul", &prefill_matmul<MXFP4>);
}
