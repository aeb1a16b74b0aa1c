// The small steps of a decoder layer, fused: at one token a step each torch op costs more in dispatch than in
// arithmetic, and RoPE with the KV store and the gated activations replace ~12 of them a layer. The MoE router's
// logits too: torch's batch-invariant form wrote [rows, experts, hidden] products (512 MB a layer at 512 tokens).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "checks.h"
#include "glu.h"
#include "simd.h"

namespace {

constexpr int64_t MAX_HEAD_DIM = 512;

// One head in place: x * cos + rotate_half(x) * sin, with HF's rounding (two products, one sum: no FMA).
void rotate(float* x, const float* cos, const float* signed_sin, int64_t d) {
  float in[MAX_HEAD_DIM];
  std::memcpy(in, x, d * sizeof(float));
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; i++) x[i] = in[i] * cos[i] + in[i + half] * signed_sin[i];
  for (int64_t i = half; i < d; i++) x[i] = in[i] * cos[i] + in[i - half] * signed_sin[i];
}

// qkv: one step's fused projections [T, (heads + 2 kv_heads) * head_dim], changed in place: RoPE on its q and
// k heads (cos and signed_sin rows per position, see models/llama.py's rope_tables), then its k and v heads
// stored in the pools ([kv_heads, num_blocks, block_size, head_dim]) at their flat slots. The pools may be
// float32 (a copy) or float16 (rounded as torch's .half() rounds: the torch path's write_kv stores the same bits).
void rope_write_kv_(at::Tensor& qkv, const at::Tensor& positions, const at::Tensor& cos, const at::Tensor& signed_sin,
                    at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& slots, int64_t num_heads) {
  const char* op = "rope_write_kv_";
  checks::float_cpu(qkv, op, "qkv"), checks::float_cpu(cos, op, "cos");
  checks::float_cpu(signed_sin, op, "signed_sin");
  const bool half = k_cache.scalar_type() == at::kHalf;
  TORCH_CHECK((half || k_cache.scalar_type() == at::kFloat) && v_cache.scalar_type() == k_cache.scalar_type() &&
              k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.device().is_cpu() && v_cache.device().is_cpu(),
              "rope_write_kv_: the K and V pools must be contiguous CPU tensors, both float32 or both float16");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes(),
              "rope_write_kv_: the K and V pools must both be [kv_heads, num_blocks, block_size, head_dim]");
  const int64_t kv_heads = k_cache.size(0), d = k_cache.size(3), pool_slots = k_cache.size(1) * k_cache.size(2);
  const int64_t tokens = qkv.size(0), width = (num_heads + 2 * kv_heads) * d;
  TORCH_CHECK(qkv.dim() == 2 && qkv.size(1) == width, "rope_write_kv_: qkv must be [tokens, ", width, "] for ",
              num_heads, " heads and the pools' ", kv_heads, " kv heads of ", d);
  TORCH_CHECK(d % 2 == 0 && d <= MAX_HEAD_DIM, "rope_write_kv_: head_dim must be even and at most ", MAX_HEAD_DIM);
  TORCH_CHECK(cos.dim() == 2 && cos.sizes() == signed_sin.sizes() && cos.size(1) == d,
              "rope_write_kv_: cos and signed_sin must be [positions, head_dim]");
  TORCH_CHECK(positions.scalar_type() == at::kLong && slots.scalar_type() == at::kLong && positions.is_contiguous() &&
              slots.is_contiguous() && positions.numel() == tokens && slots.numel() == tokens,
              "rope_write_kv_: positions and slots must be int64 [tokens]");
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int64_t* slot = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; t++) {  // a bad index would write outside the tables or pools
    TORCH_CHECK(pos[t] >= 0 && pos[t] < cos.size(0), "rope_write_kv_: position ", pos[t], " is outside the RoPE table");
    TORCH_CHECK(slot[t] >= 0 && slot[t] < pool_slots, "rope_write_kv_: slot ", slot[t], " is outside the pool");
  }
  float* rows = qkv.data_ptr<float>();
  const float *c = cos.data_ptr<float>(), *s = signed_sin.data_ptr<float>();
  auto store = [&](auto* k, auto* v) {
    at::parallel_for(0, tokens, 16, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; t++) {
        float* row = rows + t * width;
        for (int64_t h = 0; h < num_heads + kv_heads; h++) rotate(row + h * d, c + pos[t] * d, s + pos[t] * d, d);
        for (int64_t h = 0; h < kv_heads; h++) {
          const int64_t at = (h * pool_slots + slot[t]) * d;
          const float *k_row = row + (num_heads + h) * d, *v_row = row + (num_heads + kv_heads + h) * d;
          if constexpr (std::is_same_v<decltype(k), uint16_t*>) {
            store_halves<F256>(k + at, k_row, d), store_halves<F256>(v + at, v_row, d);
          } else {
            std::memcpy(k + at, k_row, d * sizeof(float)), std::memcpy(v + at, v_row, d * sizeof(float));
          }
        }
      }
    });
  };
  if (half)
    store(reinterpret_cast<uint16_t*>(k_cache.data_ptr<at::Half>()), reinterpret_cast<uint16_t*>(v_cache.data_ptr<at::Half>()));
  else
    store(k_cache.data_ptr<float>(), v_cache.data_ptr<float>());
}

// gate_up: [T, 2 * I], gate then up -> the activation's rows (silu(gate) * up, gpt-oss's swiglu_oai, or GeGLU):
// [T, I].
template <GluRow ROW>
at::Tensor glu(const at::Tensor& gate_up) {
  checks::float_cpu(gate_up, "glu", "gate_up");
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.size(1) % 2 == 0, "glu: gate_up must be [tokens, 2 * intermediate]");
  const int64_t tokens = gate_up.size(0), n = gate_up.size(1) / 2;
  at::Tensor out = at::empty({tokens, n}, gate_up.options());
  const float* in = gate_up.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, tokens, 8, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; t++) {
      const float* gate = in + t * 2 * n;
      ROW(gate, gate + n, o + t * n, n);
    }
  });
  return out;
}

// One row's logits for N experts (rows of w, `h` apart): per expert two 8-lane FMA chains over x, their lanes summed,
// then the tail past the last 16. N experts a pass share each load of x and keep 2N chains in flight.
template <int N>
void router_dots(const float* x, const float* w, float* out, int64_t h) {
  __m256 acc[N][2];
  for (int e = 0; e < N; e++) acc[e][0] = acc[e][1] = F256::zero();
  int64_t i = 0;
  for (; i + 16 <= h; i += 16) {
    const __m256 x0 = F256::load(x + i), x1 = F256::load(x + i + 8);
    for (int e = 0; e < N; e++) {
      acc[e][0] = F256::fmadd(x0, F256::load(w + e * h + i), acc[e][0]);
      acc[e][1] = F256::fmadd(x1, F256::load(w + e * h + i + 8), acc[e][1]);
    }
  }
  for (int e = 0; e < N; e++) {
    float tail = 0.f;
    for (int64_t j = i; j < h; j++) tail += x[j] * w[e * h + j];
    out[e] = F256::sum(F256::add(acc[e][0], acc[e][1])) + tail;
  }
}

constexpr int64_t ROUTER_EXPERTS = 4;  // experts a pass over a row's x takes

// x [T, H] @ router [E, H]^T -> [T, E], each logit summed in one order whatever T is: a GEMM's blocking changes
// with the row count, and a last-bit change in a router logit can change a row's experts.
at::Tensor router_logits(const at::Tensor& x, const at::Tensor& router) {
  checks::float_cpu(x, "router_logits", "x"), checks::float_cpu(router, "router_logits", "router");
  TORCH_CHECK(x.dim() == 2 && router.dim() == 2 && x.size(1) == router.size(1),
              "router_logits: x must be [tokens, hidden] and the router [experts, hidden]");
  const int64_t tokens = x.size(0), experts = router.size(0), h = x.size(1);
  const int64_t groups = (experts + ROUTER_EXPERTS - 1) / ROUTER_EXPERTS;
  at::Tensor out = at::empty({tokens, experts}, x.options());
  const float *xs = x.data_ptr<float>(), *w = router.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, tokens * groups, 16, [&](int64_t a, int64_t b) {
    for (int64_t job = a; job < b; job++) {
      const int64_t t = job / groups, e = job % groups * ROUTER_EXPERTS;
      const float *row = xs + t * h, *we = w + e * h;
      float* oe = o + t * experts + e;
      if (e + ROUTER_EXPERTS <= experts)
        router_dots<ROUTER_EXPERTS>(row, we, oe, h);
      else
        for (int64_t k = e; k < experts; k++) router_dots<1>(row, w + k * h, o + t * experts + k, h);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(inferplug, m) {
  m.def("rope_write_kv_(Tensor(a!) qkv, Tensor positions, Tensor cos, Tensor signed_sin, Tensor(b!) k_cache, "
        "Tensor(c!) v_cache, Tensor slots, int num_heads) -> ()");
  m.def("silu_mul(Tensor gate_up) -> Tensor");
  m.def("swiglu_oai_mul(Tensor gate_up) -> Tensor");
  m.def("gelu_tanh_mul(Tensor gate_up) -> Tensor");
  m.def("router_logits(Tensor x, Tensor router) -> Tensor");
}
TORCH_LIBRARY_IMPL(inferplug, CPU, m) {
  m.impl("rope_write_kv_", &rope_write_kv_);
  m.impl("silu_mul", &glu<&silu_mul_row>);
  m.impl("swiglu_oai_mul", &glu<&swiglu_oai_row>);
  m.impl("gelu_tanh_mul", &glu<&gelu_tanh_mul_row>);
  m.impl("router_logits", &router_logits);
}
