// Paged decode attention: one new query token per sequence, K/V read in place from the block pools
// through the block tables (the torch path copies every block with index_select before its matmuls).
// Each (sequence, kv head) pair is one work item: its query heads share every K/V row read from memory.
// This file checks and splits the items over threads; attend.h, in the chosen ISA's table, does each.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "kernels.h"

namespace {

inline int64_t padded(int64_t length) {
  return (length + inferplug_isa::MAX_LANES - 1) / inferplug_isa::MAX_LANES * inferplug_isa::MAX_LANES;
}

at::Tensor paged_decode(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                        const at::Tensor& block_tables, const at::Tensor& context_lens, double scale) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4, "paged_decode: q must be [batch, heads, head_dim] and the pools "
              "[kv_heads, num_blocks, block_size, head_dim]");
  const int64_t batch = q.size(0), heads = q.size(1), d = q.size(2);
  const int64_t kv_heads = k_cache.size(0), block_size = k_cache.size(2);
  TORCH_CHECK(q.scalar_type() == at::kFloat && k_cache.scalar_type() == at::kFloat &&
              v_cache.scalar_type() == at::kFloat, "paged_decode: q and the K/V pools must be float32");
  TORCH_CHECK(q.device().is_cpu() && k_cache.device().is_cpu() && v_cache.device().is_cpu(),
              "paged_decode runs on the CPU");
  TORCH_CHECK(d % 8 == 0, "paged_decode: head_dim must be a multiple of 8 (AVX2 lanes), got ", d);
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes() && k_cache.size(3) == d,
              "paged_decode: the K and V pools must match and share q's head_dim");
  TORCH_CHECK(heads % kv_heads == 0, "paged_decode: heads (", heads, ") must be a multiple of kv_heads (", kv_heads,
              ")");
  TORCH_CHECK(q.stride(2) == 1 && q.stride(1) == d, "paged_decode: each q row's heads must be contiguous");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "paged_decode: the K/V pools must be contiguous");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && context_lens.scalar_type() == at::kLong,
              "paged_decode: block_tables and context_lens must be int64");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == batch && block_tables.is_contiguous() &&
              context_lens.dim() == 1 && context_lens.size(0) == batch && context_lens.is_contiguous(),
              "paged_decode: block_tables must be [batch, max_blocks] and context_lens [batch], contiguous");

  const inferplug_isa::Pool pool{k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), k_cache.size(1), block_size, d};
  const int64_t max_blocks = block_tables.size(1);
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t* lens = context_lens.data_ptr<int64_t>();
  int64_t longest = 0;
  for (int64_t b = 0; b < batch; b++) {  // a bad table would read outside the pools: check the blocks used
    TORCH_CHECK(lens[b] >= 1 && lens[b] <= max_blocks * block_size, "paged_decode: context length ", lens[b],
                " of row ", b, " is not covered by its ", max_blocks, " blocks");
    for (int64_t i = 0; i < (lens[b] + block_size - 1) / block_size; i++)
      TORCH_CHECK(tables[b * max_blocks + i] >= 0 && tables[b * max_blocks + i] < pool.num_blocks,
                  "paged_decode: block id ", tables[b * max_blocks + i], " is outside the pool");
    longest = std::max(longest, lens[b]);
  }

  at::Tensor out = at::empty({batch, heads, d}, q.options());
  const int64_t group = heads / kv_heads, items = batch * kv_heads, q_row = q.stride(0);
  const float* q_data = q.data_ptr<float>();
  float* out_data = out.data_ptr<float>();
  // Each thread takes every threads-th item, not a contiguous run: rows come sorted by length, and
  // contiguous runs would give one thread all the long ones.
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), items));
  // A head_dim the chosen ISA's vectors do not divide (8 of 16 floats) takes the 8-lane kernel.
  const auto& isa = inferplug_isa::active();
  const auto attend = d % isa.attend_lanes == 0 ? isa.attend : inferplug_isa::avx2().attend;
  at::parallel_for(0, threads, 1, [&](int64_t first, int64_t last) {
    std::vector<int64_t> rows(padded(longest));  // one thread's scratch, sized for the longest sequence
    std::vector<float> scores(group * padded(longest));
    for (int64_t thread = first; thread < last; thread++)
      for (int64_t item = thread; item < items; item += threads) {
        const int64_t b = item / kv_heads, h = item % kv_heads;
        attend(pool, h, tables + b * max_blocks, lens[b], q_data + b * q_row + h * group * d, group,
               static_cast<float>(scale), rows.data(), scores.data(), out_data + (b * heads + h * group) * d);
      }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(inferplug, m) {
  m.def("paged_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor context_lens, float scale)"
        " -> Tensor");
}

TORCH_LIBRARY_IMPL(inferplug, CPU, m) { m.impl("paged_decode", &paged_decode); }
