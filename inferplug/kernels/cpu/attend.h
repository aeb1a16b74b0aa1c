// Paged attention for query rows of one sequence on one kv head, written once over a float width V
// (paged_attention.cpp has the torch ops). Torch-free: compiled per ISA.
//
// Flash style: keys go in tiles of KEY_TILE at absolute positions (0, 32, 64, ...), read through the block
// table; each tile's K and V rows are loaded once for every query row and query head of the
// item (GQA without copies), with an online softmax per query. A decode step is the one-row case of the
// same code, and a row's arithmetic (its dot products, its tiles, its softmax updates) depends only on its
// own length: so a token's attention is bit for bit the same in a decode step, a prefill chunk of any
// length, or after a prefix-cache hit (batch invariance).
// fp16 pools: K and V are widened to fp32 (exact), only the pool's memory traffic halves: a decode row's tile into
// scratch once, prompt rows' vectors as the loops load them. Up to 4 query heads share each K and V load.
#pragma once
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels.h"
#include "simd.h"

namespace {

// LANES of a pool row as floats: fp32 as they are, fp16 widened (exact).
template <typename V, typename T>
typename V::F load_row(const T* p) {
  if constexpr (std::is_same_v<T, inferplug_isa::Half>)
    return V::load_half(p);
  else
    return V::load(p);
}

// Query heads one pass of the weighted sum keeps in registers, 4 vectors each: AVX-512 has 32, AVX2 16.
template <typename V>
constexpr int HEADS_A_PASS = V::LANES == 16 ? 4 : 3;

// For NQ query heads of one row (their weights p, TILE apart; their outputs, head_dim apart):
// out[x0, x0 + N * LANES) += sum over the `valid` keys of p[i] * V row i, kept in registers across the keys,
// each V vector loaded once for the NQ heads. Each element's sum runs over the keys in order, whatever N and NQ.
template <typename V, int N, int NQ, typename T>
void weighted_rows(const float* p, int64_t valid, const T* v, const int64_t* keys, int64_t d, int64_t x0,
                   float* out) {
  typename V::F acc[NQ][N];
  for (int h = 0; h < NQ; h++)
    for (int u = 0; u < N; u++) acc[h][u] = V::load(out + h * d + x0 + u * V::LANES);
  for (int64_t i = 0; i < valid; i++) {
    const T* row = v + keys[i] + x0;
    for (int u = 0; u < N; u++) {
      const auto value = load_row<V>(row + u * V::LANES);
      for (int h = 0; h < NQ; h++) acc[h][u] = V::fmadd(V::set1(p[h * inferplug_isa::KEY_TILE + i]), value, acc[h][u]);
    }
  }
  for (int h = 0; h < NQ; h++)
    for (int u = 0; u < N; u++) V::store(out + h * d + x0 + u * V::LANES, acc[h][u]);
}

template <typename V, int NQ, typename T>
void weighted_heads(const float* p, int64_t valid, const T* v, const int64_t* keys, int64_t d, float* out) {
  constexpr int64_t WIDE = 4 * V::LANES;
  int64_t x = 0;
  for (; x + WIDE <= d; x += WIDE) weighted_rows<V, 4, NQ>(p, valid, v, keys, d, x, out);
  for (; x < d; x += V::LANES) weighted_rows<V, 1, NQ>(p, valid, v, keys, d, x, out);
}

// The `group` heads of one row, HEADS_A_PASS at a time, then the rest in one pass.
template <typename V, typename T>
void weighted_sum(const float* p, int64_t valid, const T* v, const int64_t* keys, int64_t d, int64_t group,
                  float* out) {
  constexpr int64_t TILE = inferplug_isa::KEY_TILE;
  constexpr int HEADS = HEADS_A_PASS<V>;
  int64_t h = 0;
  for (; h + HEADS <= group; h += HEADS) weighted_heads<V, HEADS>(p + h * TILE, valid, v, keys, d, out + h * d);
  if (group - h == 3) weighted_heads<V, 3>(p + h * TILE, valid, v, keys, d, out + h * d);
  if (group - h == 2) weighted_heads<V, 2>(p + h * TILE, valid, v, keys, d, out + h * d);
  if (group - h == 1) weighted_heads<V, 1>(p + h * TILE, valid, v, keys, d, out + h * d);
}

// s[j][0, KEY_TILE) = scale * q[j] . k for the tile's keys, for NQ (1, 2 or 4) queries: each (query, key) sum over
// head_dim in V::LANES lanes, then one fixed reduction tree per sum (V::sums_of, LANES / NQ sums for each query).
// The NQ queries share each K load; a sum's arithmetic is the same whichever lane it lands in, so a query gives
// the same scores alone or beside any partners.
template <typename V, int NQ, typename T>
void tile_scores(const float* const q[NQ], const T* k, const int64_t* keys, int64_t d, float scale,
                 float* const s[NQ]) {
  constexpr int64_t PER = V::LANES / NQ;  // keys a pass, for each query
  alignas(64) float sums[V::LANES];
  for (int64_t c = 0; c < inferplug_isa::KEY_TILE; c += PER) {
    typename V::F acc[V::LANES];
    for (int64_t i = 0; i < V::LANES; i++) acc[i] = V::zero();
    for (int64_t x = 0; x < d; x += V::LANES) {
      typename V::F qx[NQ];
      for (int j = 0; j < NQ; j++) qx[j] = V::load(q[j] + x);
      for (int64_t i = 0; i < PER; i++) {
        const auto key = load_row<V>(k + keys[c + i] + x);
        for (int j = 0; j < NQ; j++) acc[V::TREE_ORDER[j * PER + i]] = V::fmadd(qx[j], key, acc[V::TREE_ORDER[j * PER + i]]);
      }
    }
    V::store(sums, V::mul(V::sums_of(acc), V::set1(scale)));
    for (int j = 0; j < NQ; j++) std::copy(sums + j * PER, sums + (j + 1) * PER, s[j] + c);
  }
}

// The tile's `rows` K and V rows (at `keys` in k and v) widened to fp32 as [rows, d] in k_out and v_out;
// keys becomes their offsets there.
template <typename V>
void widen_tile(const inferplug_isa::Half* k, const inferplug_isa::Half* v, int64_t* keys, int64_t rows, int64_t d,
                float* k_out, float* v_out) {
  for (int64_t i = 0; i < rows; i++) {
    for (int64_t x = 0; x < d; x += V::LANES) {
      V::store(k_out + i * d + x, V::load_half(k + keys[i] + x));
      V::store(v_out + i * d + x, V::load_half(v + keys[i] + x));
    }
    keys[i] = i * d;
  }
}

// The online softmax of n <= LANES queries' scores for one tile (s: their scores, TILE apart, masked keys -inf), all
// their statistics in one vector: each query's tile max and sum are one lane of a tree reduction (V::maxes_of,
// V::sums_of), the same for a query in any lane. The scores become their weights exp(score - max); max and sum
// are updated, and rescale gets each query's factor on what came before (1 while its max holds, 0 at the start).
// max, sum and rescale hold LANES entries from the first query: those past n are scratch.
template <typename V>
void tile_softmax(float* s, int64_t n, float* max, float* sum, float* rescale) {
  constexpr int64_t TILE = inferplug_isa::KEY_TILE;
  typename V::F part[V::LANES];
  for (int64_t i = 0; i < V::LANES; i++) {
    auto m = V::zero();
    if (i < n) {
      m = V::load(s + i * TILE);
      for (int64_t c = V::LANES; c < TILE; c += V::LANES) m = V::max(V::load(s + i * TILE + c), m);
    }
    part[V::TREE_ORDER[i]] = m;
  }
  const auto old = V::load(max), top = V::max(old, V::maxes_of(part));
  V::store(max, top);
  const auto factor = exp_nonpositive<V>(V::sub(old, top));
  V::store(rescale, factor);
  for (int64_t i = 0; i < V::LANES; i++) {
    auto total = V::zero();
    if (i < n) {
      const auto shift = V::set1(max[i]);
      for (int64_t c = 0; c < TILE; c += V::LANES) {
        const auto e = exp_nonpositive<V>(V::sub(V::load(s + i * TILE + c), shift));
        V::store(s + i * TILE + c, e);
        total = V::add(total, e);
      }
    }
    part[V::TREE_ORDER[i]] = total;
  }
  V::store(sum, V::add(V::mul(V::load(sum), factor), V::sums_of(part)));
}

// Rows r of `w` (each with `group` query heads, head_dim apart) attend to keys [0, first_length + r), or to the
// last w.window of them.
// scratch: attend_scratch(w.rows, group, head_dim) floats.
template <typename V, typename T>
void attend(const inferplug_isa::Pool<T>& pool, int64_t kv_head, const int64_t* blocks,
            const inferplug_isa::QueryRows& w, int64_t group, float scale, float* scratch) {
  constexpr int64_t TILE = inferplug_isa::KEY_TILE;
  const int64_t d = pool.head_dim, bs = pool.block_size, queries = w.rows * group;
  const int64_t stats = queries + inferplug_isa::MAX_LANES;  // a vector's lanes past the last query: scratch
  float* scores = scratch;               // [queries, TILE]
  float* acc = scores + queries * TILE;  // [queries, d]: the unnormalized output
  float* max = acc + queries * d;        // [stats]: the running max score
  float* sum = max + stats;              // [stats]: the running softmax denominator
  float* rescale = sum + stats;          // [stats]: this tile's factor on the output so far
  float* k_tile = rescale + stats;       // [TILE, d] each: an fp16 tile widened for a decode row
  float* v_tile = k_tile + TILE * d;
  std::fill(acc, acc + queries * d, 0.f);
  std::fill(max, max + stats, -INFINITY);
  std::fill(sum, sum + stats, 0.f);
  const int64_t head = kv_head * pool.num_blocks * bs * d;
  const T *k = pool.k + head, *v = pool.v + head;
  const int64_t longest = w.first_length + w.rows - 1;
  // A sliding window: row r's keys start at first_length + r - window. Tiles before row 0's window are skipped,
  // and a row whose window starts past a tile sits that tile out (its scores would all be masked).
  const auto window_start = [&](int64_t r) { return w.window ? std::max<int64_t>(0, w.first_length + r - w.window) : 0; };
  int64_t keys[TILE];  // the tile's K/V row offsets in the pools (in the scratch tiles once widened there)
  for (int64_t t0 = window_start(0) / TILE * TILE; t0 < longest; t0 += TILE) {
    const int64_t in_tile = std::min(TILE, longest - t0);
    for (int64_t i = 0, b = t0 / bs, o = t0 % bs; i < in_tile; i++) {
      keys[i] = (blocks[b] * bs + o) * d;
      if (++o == bs) o = 0, b++;
    }
    // Rows are by ascending length: those that end before the tile are done.
    const int64_t first = std::max<int64_t>(0, t0 + 1 - w.first_length);
    // rows [first, last) have keys in this tile: the later ones' windows start past it
    const int64_t last = w.window ? std::min<int64_t>(w.rows, t0 + TILE + w.window - w.first_length) : w.rows;
    const int64_t in_queries = last * group;
    const auto tile = [&](const auto* k, const auto* v) {  // the tile's work, on its rows at keys in k and v
      std::fill(keys + in_tile, keys + TILE, keys[in_tile - 1]);  // past the end: scored, then masked
      const auto query = [&](int64_t i) { return w.q + i / group * w.q_stride + i % group * d; };
      int64_t a = first * group;
      for (; a + 3 < in_queries; a += 4) {
        const float* q[4] = {query(a), query(a + 1), query(a + 2), query(a + 3)};
        float* s[4] = {scores + a * TILE, scores + (a + 1) * TILE, scores + (a + 2) * TILE, scores + (a + 3) * TILE};
        tile_scores<V, 4>(q, k, keys, d, scale, s);
      }
      for (; a + 1 < in_queries; a += 2) {
        const float* q[2] = {query(a), query(a + 1)};
        float* s[2] = {scores + a * TILE, scores + (a + 1) * TILE};
        tile_scores<V, 2>(q, k, keys, d, scale, s);
      }
      if (a < in_queries) {  // a lone last query (a decode row of an MHA model): half the work of pairing it with itself
        const float* q[1] = {query(a)};
        float* s[1] = {scores + a * TILE};
        tile_scores<V, 1>(q, k, keys, d, scale, s);
      }
      const auto valid = [&](int64_t r) { return std::min(TILE, w.first_length + r - t0); };  // row r's keys here
      for (int64_t r = first; r < last; r++) {
        const int64_t before = std::max<int64_t>(0, window_start(r) - t0);  // keys before the row's window
        for (float* s = scores + r * group * TILE; s < scores + (r + 1) * group * TILE; s += TILE) {
          std::fill(s, s + before, -INFINITY);
          std::fill(s + valid(r), s + TILE, -INFINITY);
        }
      }
      for (int64_t q0 = first * group; q0 < in_queries; q0 += V::LANES)
        tile_softmax<V>(scores + q0 * TILE, std::min(V::LANES, in_queries - q0), max + q0, sum + q0, rescale + q0);
      // tile_softmax wrote its vector's spare lanes: where those are rows whose windows start later, they have
      // seen no key yet, so their statistics go back to the start
      std::fill(max + in_queries, max + std::min(queries, in_queries + inferplug_isa::MAX_LANES), -INFINITY);
      std::fill(sum + in_queries, sum + std::min(queries, in_queries + inferplug_isa::MAX_LANES), 0.f);
      for (int64_t r = first; r < last; r++) {
        for (int64_t query = r * group; query < (r + 1) * group; query++) {
          if (rescale[query] == 1.f) continue;
          float* out = acc + query * d;
          for (int64_t x = 0; x < d; x += V::LANES) V::store(out + x, V::mul(V::load(out + x), V::set1(rescale[query])));
        }
        weighted_sum<V>(scores + r * group * TILE, valid(r), v, keys, d, group, acc + r * group * d);
      }
    };
    // An fp16 pool's tile for a decode row (only its own query heads read it) is gathered from its blocks into
    // fp32 scratch first: a sequential copy read 1.1-1.3x faster than its scattered blocks read in place.
    // Prompt rows read it in place: their passes find it in L1, and the copy's stores cost more (0.54-0.77x).
    if constexpr (std::is_same_v<T, inferplug_isa::Half>) {
      if (w.rows == 1) {
        widen_tile<V>(k, v, keys, in_tile, d, k_tile, v_tile);
        tile(static_cast<const float*>(k_tile), static_cast<const float*>(v_tile));
        continue;
      }
    }
    tile(k, v);
  }
  for (int64_t r = 0; r < w.rows; r++)
    for (int64_t j = 0; j < group; j++) {
      const int64_t query = r * group + j;
      float denominator = sum[query];
      if (w.sinks) {  // the sink's term exp(sink - max) joins the denominator; the sum is taken at the larger max
        const float top = std::max(max[query], w.sinks[j]), shift = std::exp(max[query] - top);
        denominator = (sum[query] * shift + std::exp(w.sinks[j] - top)) / shift;
      }
      const auto inverse = V::set1(1.f / denominator);
      for (int64_t x = 0; x < d; x += V::LANES)
        V::store(w.out + r * w.out_stride + j * d + x, V::mul(V::load(acc + query * d + x), inverse));
    }
}

}  // namespace
