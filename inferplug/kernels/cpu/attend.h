// Paged decode attention for one (sequence, kv head) pair, written once over a float width V
// (paged_decode.cpp has the torch op). Torch-free: compiled per ISA.
// Tokens go V::LANES at a time, so their scores fill one vector (one exp, no horizontal sum per token).
#pragma once
#include <algorithm>
#include <cmath>

#include "kernels.h"
#include "simd.h"

namespace {

// The `group` query heads (rows of q, head_dim apart) of one sequence on one kv head, into `out` (same
// layout). Two passes over the K/V rows: scores and their softmax, then the softmax-weighted sum of V.
template <typename V>
void attend(const inferplug_isa::Pool& pool, int64_t kv_head, const int64_t* blocks, int64_t length, const float* q,
            int64_t group, float scale, int64_t* rows, float* scores, float* out) {
  constexpr int64_t CHUNK = V::LANES;
  const int64_t d = pool.head_dim, width = (length + CHUNK - 1) / CHUNK * CHUNK;
  for (int64_t t = 0, b = 0; t < length; b++)  // two loops, not t / block_size: a division costs more than a row
    for (int64_t i = 0; i < pool.block_size && t < length; i++) rows[t++] = (blocks[b] * pool.block_size + i) * d;
  std::fill(rows + length, rows + width, rows[length - 1]);  // past the end: its score is dropped, its weight 0
  const int64_t head = kv_head * pool.num_blocks * pool.block_size * d;
  const float *k = pool.k + head, *v = pool.v + head;

  for (int64_t t = 0; t < width; t += CHUNK) {
    for (int64_t j = 0; j < group; j++) {  // the chunk's K rows come from memory once, then from L1
      typename V::F acc[CHUNK];
      for (int64_t i = 0; i < CHUNK; i++) acc[i] = V::zero();
      for (int64_t x = 0; x < d; x += V::LANES) {
        const auto qx = V::load(q + j * d + x);
        for (int64_t i = 0; i < CHUNK; i++) acc[i] = V::fmadd(qx, V::load(k + rows[t + i] + x), acc[i]);
      }
      V::store(scores + j * width + t, V::mul(V::sums_of(acc), V::set1(scale)));
    }
  }

  for (int64_t j = 0; j < group; j++) {  // softmax, max-subtracted so exp never overflows
    float* s = scores + j * width;
    std::fill(s + length, s + width, -INFINITY);
    const auto max = V::set1(*std::max_element(s, s + length));
    auto sum = V::zero();
    for (int64_t t = 0; t < width; t += CHUNK) {
      const auto e = exp_nonpositive<V>(V::sub(V::load(s + t), max));
      V::store(s + t, e);
      sum = V::add(sum, e);
    }
    const auto inverse = V::set1(1.f / V::sum(sum));
    for (int64_t t = 0; t < width; t += CHUNK) V::store(s + t, V::mul(V::load(s + t), inverse));
  }

  std::fill(out, out + group * d, 0.f);
  for (int64_t t = 0; t < width; t += CHUNK) {
    for (int64_t j = 0; j < group; j++) {
      typename V::F weight[CHUNK];
      for (int64_t i = 0; i < CHUNK; i++) weight[i] = V::set1(scores[j * width + t + i]);
      for (int64_t x = 0; x < d; x += V::LANES) {
        auto acc = V::load(out + j * d + x);
        for (int64_t i = 0; i < CHUNK; i++) acc = V::fmadd(weight[i], V::load(v + rows[t + i] + x), acc);
        V::store(out + j * d + x, acc);
      }
    }
  }
}

}  // namespace
