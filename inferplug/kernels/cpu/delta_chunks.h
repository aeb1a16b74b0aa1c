// The chunked gated delta rule for one value head of one sequence's prompt rows (Qwen3.5's Gated DeltaNet),
// written once over a float width V (delta_rule.cpp has the torch op). Torch-free: compiled per ISA.
//
// kernels/delta_rule_ref.py's WY form, chunk by chunk of DELTA_CHUNK tokens on the prompt's grid: with the decays
// cumulated from the chunk's start (c), L the strictly lower part of beta K K^T exp(c_i - c_j),
//   (I + L) U = beta V,  (I + L) W = beta K exp(c),  new = U - W S,
//   out = exp(c) Q S + (Q K^T exp(c_i - c_j), j <= i) new,  S' = exp(c_last) S + (K exp(c_last - c))^T new.
// The last chunk is padded with zero rows (g = 0, beta = 0), which leave S as it is, as the reference pads it.
// The products run in add_products' fixed order, so a head's bits depend only on its own rows and their chunks.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels.h"
#include "simd.h"

namespace {

using inferplug_isa::DELTA_CHUNK;

// NR rows of c, NV vectors from column j: c += a b over `depth` (a [rows, depth], b [depth, cols], each c value's
// sum in order of depth), b's vectors loaded once for the NR rows.
template <typename V, int NR, int NV>
void add_block(const float* a, int64_t a_stride, const float* b, int64_t b_stride, int64_t depth, float* c,
               int64_t c_stride) {
  typename V::F acc[NR][NV];
  for (int r = 0; r < NR; r++)
    for (int u = 0; u < NV; u++) acc[r][u] = V::load(c + r * c_stride + u * V::LANES);
  for (int64_t d = 0; d < depth; d++) {
    for (int u = 0; u < NV; u++) {
      const auto bv = V::load(b + d * b_stride + u * V::LANES);
      for (int r = 0; r < NR; r++) acc[r][u] = V::fmadd(V::set1(a[r * a_stride + d]), bv, acc[r][u]);
    }
  }
  for (int r = 0; r < NR; r++)
    for (int u = 0; u < NV; u++) V::store(c + r * c_stride + u * V::LANES, acc[r][u]);
}

template <typename V, int NR>
void add_rows(const float* a, int64_t a_stride, const float* b, int64_t b_stride, int64_t depth, int64_t cols,
              float* c, int64_t c_stride) {
  constexpr int WIDE = 4;  // vectors a block: 4 rows x 4 vectors of accumulators
  int64_t j = 0;
  for (; j + WIDE * V::LANES <= cols; j += WIDE * V::LANES)
    add_block<V, NR, WIDE>(a, a_stride, b + j, b_stride, depth, c + j, c_stride);
  for (; j + V::LANES <= cols; j += V::LANES) add_block<V, NR, 1>(a, a_stride, b + j, b_stride, depth, c + j, c_stride);
  for (; j < cols; j++)  // a width that is no whole number of vectors (the tests' small heads)
    for (int r = 0; r < NR; r++) {
      float sum = c[r * c_stride + j];
      for (int64_t d = 0; d < depth; d++) sum = std::fma(a[r * a_stride + d], b[d * b_stride + j], sum);
      c[r * c_stride + j] = sum;
    }
}

// c [rows, cols] += a [rows, depth] b [depth, cols], all row-major.
template <typename V>
void add_products(const float* a, int64_t a_stride, int64_t rows, const float* b, int64_t b_stride, int64_t depth,
                  int64_t cols, float* c, int64_t c_stride) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4)
    add_rows<V, 4>(a + r * a_stride, a_stride, b, b_stride, depth, cols, c + r * c_stride, c_stride);
  for (; r < rows; r++) add_rows<V, 1>(a + r * a_stride, a_stride, b, b_stride, depth, cols, c + r * c_stride, c_stride);
}

// row -= m x, over n values (a triangular solve's step).
template <typename V>
void subtract_scaled(float* row, float m, const float* x, int64_t n) {
  int64_t j = 0;
  for (; j + V::LANES <= n; j += V::LANES)
    V::store(row + j, V::fnmadd(V::set1(m), V::load(x + j), V::load(row + j)));
  for (; j < n; j++) row[j] = std::fma(-m, x[j], row[j]);
}

// Rows [0, DELTA_CHUNK) of x [DELTA_CHUNK, n] solve (I + lower) x = x in place, `lower` strictly lower.
template <typename V>
void unit_lower_solve(const float* lower, float* x, int64_t n) {
  for (int64_t i = 1; i < DELTA_CHUNK; i++)
    for (int64_t j = 0; j < i; j++) subtract_scaled<V>(x + i * n, lower[i * DELTA_CHUNK + j], x + j * n, n);
}

// Row i of scores [DELTA_CHUNK, DELTA_CHUNK] times exp(c_i - c_j) for j <= i, the rest (j >= i where `strict`)
// zero. g <= 0 (a decay), so c falls and c_i - c_j <= 0 where kept: later columns' positive differences are
// clamped to 0 before the exp, then zeroed.
template <typename V>
void decay_row(float* scores, const float* c, int64_t i, bool strict) {
  const auto ci = V::set1(c[i]);
  for (int64_t j = 0; j < DELTA_CHUNK; j += V::LANES) {
    auto x = V::sub(ci, V::load(c + j));
    x = V::zero_where(V::less(V::zero(), x), x);
    V::store(scores + i * DELTA_CHUNK + j, V::mul(V::load(scores + i * DELTA_CHUNK + j), exp_nonpositive<V>(x)));
  }
  for (int64_t j = strict ? i : i + 1; j < DELTA_CHUNK; j++) scores[i * DELTA_CHUNK + j] = 0.f;
}

template <typename V>
void delta_rule_head(const inferplug_isa::DeltaRuleHead& h, float* scratch) {
  constexpr int64_t C = DELTA_CHUNK;
  static_assert(C % 16 == 0, "decay_row steps whole vectors of the widest width");
  const int64_t K = h.key_dim, D = h.value_dim;
  float *q = scratch, *k = q + C * K, *kb = k + C * K, *kt = kb + C * K, *u = kt + K * C, *w = u + C * D;
  float *p = w + C * K, *fresh = p + C * D, *lower = fresh + C * D, *inner = lower + C * C, *c = inner + C * C;
  float* s = h.state;
  for (int64_t t0 = 0; t0 < h.n; t0 += C) {
    const int64_t rows = std::min(C, h.n - t0);
    float sum = 0.f;
    for (int64_t i = 0; i < C; i++) {  // the chunk's rows (zero past the prompt), beta V in u, the decays
      const int64_t t = t0 + i;
      const float beta = i < rows ? h.beta[t * h.gate_stride] : 0.f;
      sum += i < rows ? h.g[t * h.gate_stride] : 0.f;
      c[i] = sum;
      for (int64_t d = 0; d < K; d++) {
        q[i * K + d] = i < rows ? h.q[t * h.key_stride + d] : 0.f;
        k[i * K + d] = i < rows ? h.k[t * h.key_stride + d] : 0.f;
        kb[i * K + d] = k[i * K + d] * beta;
        kt[d * C + i] = k[i * K + d];
      }
      for (int64_t d = 0; d < D; d++) u[i * D + d] = i < rows ? h.v[t * h.value_stride + d] * beta : 0.f;
    }
    std::memset(lower, 0, sizeof(float) * C * C);
    std::memset(inner, 0, sizeof(float) * C * C);
    add_products<V>(kb, K, C, kt, C, K, C, lower, C);  // beta K K^T
    add_products<V>(q, K, C, kt, C, K, C, inner, C);   // Q K^T
    for (int64_t i = 0; i < C; i++) {
      decay_row<V>(lower, c, i, true);
      decay_row<V>(inner, c, i, false);
      const float e = std::exp(c[i]);
      for (int64_t d = 0; d < K; d++) {
        w[i * K + d] = kb[i * K + d] * e;
        q[i * K + d] *= e;  // Q exp(c), for Q S below
      }
    }
    unit_lower_solve<V>(lower, u, D);
    unit_lower_solve<V>(lower, w, K);
    std::memset(p, 0, sizeof(float) * C * D);
    add_products<V>(w, K, C, s, D, K, D, p, D);  // W S
    for (int64_t i = 0; i < C * D; i++) fresh[i] = u[i] - p[i];
    std::memset(p, 0, sizeof(float) * C * D);
    add_products<V>(q, K, C, s, D, K, D, p, D);          // exp(c) Q S
    add_products<V>(inner, C, C, fresh, D, C, D, p, D);  // + the chunk's own rows
    for (int64_t i = 0; i < rows; i++) std::memcpy(h.out + (t0 + i) * h.out_stride, p + i * D, sizeof(float) * D);
    const float last = c[C - 1], carry = std::exp(last);
    for (int64_t i = 0; i < C; i++) {  // K exp(c_last - c), transposed into kt
      const float e = std::exp(last - c[i]);
      for (int64_t d = 0; d < K; d++) kt[d * C + i] = k[i * K + d] * e;
    }
    for (int64_t i = 0; i < K * D; i++) s[i] *= carry;
    add_products<V>(kt, C, K, fresh, D, C, D, s, D);
  }
}

}  // namespace
