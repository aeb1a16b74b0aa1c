// Paged attention on the CPU: K/V read in place from the block pools through the block tables (the torch
// path copies every block with index_select before its matmuls, and its prefill falls back to SDPA's math).
// paged_attention takes sequences of any number of new query rows (prefill chunks, decode rows, both in one
// step); paged_decode is its one-row-per-sequence case. Each (sequence, QUERY_TILE rows, kv head) is one
// work item, its query heads and rows sharing every K/V tile read. This file checks and splits the items
// over threads; attend.h, in the chosen ISA's table, does each. The pools may be float32 or float16 (read back
// to fp32 tile by tile); q, the output and all arithmetic stay float32. `window` > 0: a sliding-window layer's
// rows each attend to their last `window` keys only (Gemma 3, Mistral). `sinks`: one logit per query head that
// joins each of its queries' softmax denominators (gpt-oss).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "kernels.h"

namespace {

struct Item {
  int64_t seq, row, rows, kv_head;  // rows [row, row + rows) of the sequence, q's flat rows
};

// Sequence s: q rows [starts[s], starts[s + 1]), the last of them at position lens[s] - 1.
at::Tensor attention(const char* op, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                     const at::Tensor& block_tables, const int64_t* starts, const at::Tensor& context_lens,
                     double scale, const c10::optional<at::Tensor>& out_arg, int64_t window,
                     const c10::optional<at::Tensor>& sinks) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4, op, ": q must be [tokens, heads, head_dim] and the pools "
              "[kv_heads, num_blocks, block_size, head_dim]");
  const int64_t tokens = q.size(0), heads = q.size(1), d = q.size(2);
  const int64_t kv_heads = k_cache.size(0), block_size = k_cache.size(2);
  const bool half = k_cache.scalar_type() == at::kHalf;
  TORCH_CHECK(q.scalar_type() == at::kFloat && (half || k_cache.scalar_type() == at::kFloat) &&
              v_cache.scalar_type() == k_cache.scalar_type(), op,
              ": q must be float32 and the K/V pools both float32 or both float16");
  TORCH_CHECK(q.device().is_cpu() && k_cache.device().is_cpu() && v_cache.device().is_cpu(), op, " runs on the CPU");
  TORCH_CHECK(d % 8 == 0, op, ": head_dim must be a multiple of 8 (AVX2 lanes), got ", d);
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes() && k_cache.size(3) == d, op,
              ": the K and V pools must match and share q's head_dim");
  TORCH_CHECK(heads % kv_heads == 0, op, ": heads (", heads, ") must be a multiple of kv_heads (", kv_heads, ")");
  TORCH_CHECK(q.stride(2) == 1 && q.stride(1) == d, op, ": each q row's heads must be contiguous");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), op, ": the K/V pools must be contiguous");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && context_lens.scalar_type() == at::kLong, op,
              ": block_tables and context_lens must be int64");
  const int64_t seqs = context_lens.numel();
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == seqs && block_tables.is_contiguous() &&
              context_lens.dim() == 1 && context_lens.is_contiguous(), op,
              ": block_tables must be [sequences, max_blocks] and context_lens [sequences], contiguous");
  TORCH_CHECK(starts[0] == 0 && starts[seqs] == tokens, op, ": the sequences' query rows must cover q's ", tokens,
              " rows");

  TORCH_CHECK(!sinks || (sinks->scalar_type() == at::kFloat && sinks->dim() == 1 && sinks->numel() == heads &&
                          sinks->is_contiguous() && sinks->device().is_cpu()), op,
              ": sinks must be a contiguous float32 CPU tensor of one logit per query head (", heads, ")");
  const float* sink_data = sinks ? sinks->data_ptr<float>() : nullptr;
  const int64_t num_blocks = k_cache.size(1);
  const int64_t max_blocks = block_tables.size(1);
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t* lens = context_lens.data_ptr<int64_t>();
  std::vector<Item> items;
  for (int64_t s = 0; s < seqs; s++) {  // a bad table would read outside the pools: check the blocks used
    const int64_t rows = starts[s + 1] - starts[s];
    TORCH_CHECK(rows >= 1 && lens[s] >= rows, op, ": sequence ", s, " has ", rows, " query rows and context length ",
                lens[s], " (it needs at least one row, and no more than its length)");
    TORCH_CHECK(lens[s] <= max_blocks * block_size, op, ": context length ", lens[s], " of sequence ", s,
                " is not covered by its ", max_blocks, " blocks");
    for (int64_t i = 0; i < (lens[s] + block_size - 1) / block_size; i++)
      TORCH_CHECK(tables[s * max_blocks + i] >= 0 && tables[s * max_blocks + i] < num_blocks, op, ": block id ",
                  tables[s * max_blocks + i], " is outside the pool");
    for (int64_t row = 0; row < rows; row += inferplug_isa::QUERY_TILE)
      for (int64_t h = 0; h < kv_heads; h++)
        items.push_back({s, row, std::min(inferplug_isa::QUERY_TILE, rows - row), h});
  }

  at::Tensor out = out_arg ? *out_arg : at::empty({tokens, heads, d}, q.options());
  TORCH_CHECK(out.sizes() == q.sizes() && out.is_contiguous() && out.scalar_type() == at::kFloat && out.device().is_cpu(), op,
              ": out must be a contiguous float32 CPU tensor shaped like q");
  const int64_t group = heads / kv_heads, count = static_cast<int64_t>(items.size());
  const float* q_data = q.data_ptr<float>();
  float* out_data = out.data_ptr<float>();
  // Each thread takes every threads-th item, not a contiguous run: the items' costs grow with their
  // positions, and contiguous runs would give one thread all the long ones.
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), count));
  // A head_dim the chosen ISA's vectors do not divide (8 of 16 floats) takes the 8-lane kernel.
  const auto& isa = d % inferplug_isa::active().attend_lanes == 0 ? inferplug_isa::active() : inferplug_isa::avx2();
  auto run = [&](const auto& pool, auto attend) {
    at::parallel_for(0, threads, 1, [&](int64_t first, int64_t last) {
      std::vector<float> scratch(inferplug_isa::attend_scratch(inferplug_isa::QUERY_TILE, group, d));
      for (int64_t thread = first; thread < last; thread++)
        for (int64_t i = thread; i < count; i += threads) {
          const Item& it = items[i];
          const int64_t row = starts[it.seq] + it.row, rows = starts[it.seq + 1] - starts[it.seq];
          const inferplug_isa::QueryRows w{q_data + row * q.stride(0) + it.kv_head * group * d, q.stride(0),
                                           out_data + row * heads * d + it.kv_head * group * d, heads * d, it.rows,
                                           lens[it.seq] - rows + it.row + 1, window,
                                           sink_data ? sink_data + it.kv_head * group : nullptr};
          attend(pool, it.kv_head, tables + it.seq * max_blocks, w, group, static_cast<float>(scale), scratch.data());
        }
    });
  };
  if (half) {
    using inferplug_isa::Half;  // at::Half's bits
    const auto *k = reinterpret_cast<const Half*>(k_cache.data_ptr<at::Half>()),
               *v = reinterpret_cast<const Half*>(v_cache.data_ptr<at::Half>());
    run(inferplug_isa::Pool<Half>{k, v, num_blocks, block_size, d}, isa.attend_half);
  } else {
    run(inferplug_isa::Pool<float>{k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), num_blocks, block_size, d},
        isa.attend);
  }
  return out;
}

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& block_tables, const at::Tensor& query_starts,
                           const at::Tensor& context_lens, double scale, const c10::optional<at::Tensor>& out,
                           int64_t window, const c10::optional<at::Tensor>& sinks) {
  TORCH_CHECK(window >= 0, "paged_attention: window must be 0 (none) or a window's size, got ", window);
  TORCH_CHECK(query_starts.scalar_type() == at::kLong && query_starts.dim() == 1 && query_starts.is_contiguous() &&
              query_starts.numel() == context_lens.numel() + 1,
              "paged_attention: query_starts must be int64 [sequences + 1], contiguous");
  return attention("paged_attention", q, k_cache, v_cache, block_tables, query_starts.data_ptr<int64_t>(), context_lens,
                   scale, out, window, sinks);
}

at::Tensor paged_decode(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                        const at::Tensor& block_tables, const at::Tensor& context_lens, double scale) {
  std::vector<int64_t> starts(context_lens.numel() + 1);  // row b is sequence b
  for (int64_t b = 0; b < static_cast<int64_t>(starts.size()); b++) starts[b] = b;
  return attention("paged_decode", q, k_cache, v_cache, block_tables, starts.data(), context_lens, scale, c10::nullopt,
                   0, c10::nullopt);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(inferplug, m) {
  m.def("paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor query_starts, "
        "Tensor context_lens, float scale, Tensor(a!)? out=None, int window=0, Tensor? sinks=None) -> Tensor");
  m.def("paged_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor context_lens, float scale)"
        " -> Tensor");
}

TORCH_LIBRARY_IMPL(inferplug, CPU, m) {
  m.impl("paged_attention", &paged_attention);
  m.impl("paged_decode", &paged_decode);
}
