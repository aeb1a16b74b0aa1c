// The ISA-specific part of the kernels: torch-free functions on raw pointers, one table per instruction
// set (isa_avx2.cpp, isa_avx512.cpp, both from the same templates). The torch ops check arguments, split
// the work over threads and call active()'s entries, so they hold no AVX-512 code themselves.
#pragma once
#include <cstdint>

namespace inferplug_isa {

constexpr int64_t QK = 32;         // weights per block
constexpr int64_t GROUP = 8;       // blocks per float step: one 8-lane vector of their scales
// A row's quants (and x's int8 values) go by runs of 16 blocks, 4-byte words interleaved: word 0 of every
// block in the run, then word 1, ... So one vector load gives the same word of 8 or 16 blocks, and an
// integer multiply-add leaves each block's dot product in its own lane: no horizontal sums.
constexpr int64_t RUN = 16;
constexpr int64_t WORD = 4;
constexpr int64_t RUN_WORDS_BYTES = RUN * WORD;  // from a word of x's run to its next word
constexpr int64_t MAX_LANES = 16;  // the widest float vector: scratch is padded to a multiple of it
// x rows one call of a matmul entry takes: 8 decode streams share each unpacked weight (at 4, 8 rows of a 7B
// Q4_K MLP matmul ran at 400 GOP/s on 2 Zen 4 cores; at 8, 590)
constexpr int64_t MAX_ROWS = 8;

// x per block: int8 values, its scale and scale * sum(values) (for Q4_1's min term), each row padded with zero
// blocks to a whole number of runs; row-major, but for the values. They go by runs (each run's words interleaved),
// and a run of row m starts at m * row_step + its index * run_step: row-major (row_step a row's bytes), or run-major
// (run r of row 0, of row 1, ..., then run r + 1), so that the 8 rows of a dense matmul's pass read one contiguous
// 4 KiB a run, not 8 pieces a row apart on the same L1 sets (quant_dot.h's chunk_blocks has the figures). An MoE's
// pair inputs stay row-major: an expert takes 1-2 of 256 rows, whose runs would lie 128 KiB apart.
struct QuantizedRows {
  int64_t blocks;  // per row, padded
  int64_t rows, row_step, run_step;
  const int8_t* q;
  const float *scale, *sum;
  const int32_t* qsum;  // each block's sum of q (VNNI's Q8_0 dot: sum((q_w + 128) q_x) - 128 sum(q_x))
  // Q6_K's codes are its weights + 32: -32 times the sum of each block's first 16 q and of its last 16, where the
  // two halves' integer sums start (its sub-blocks of 16 take their own scales)
  const int32_t *q6_low, *q6_high;
};

// Where row m's run of x's values that holds block b starts.
inline int64_t run_at(const QuantizedRows& x, int64_t m, int64_t b) { return m * x.row_step + b / RUN * x.run_step; }

struct WeightRows {  // rows of Q4_1 / Q4_G128 / Q4_K / Q5_0 / Q5_K / Q6_K / Q8_0 / MXFP4 blocks, each row's fields regrouped (quant_matmul.cpp), quants by runs
  const uint8_t* data;
  int64_t row_bytes, blocks;
};

using Half = uint16_t;  // an IEEE fp16 value's bits (at::Half's layout; the kernels convert with F16C / AVX-512)

// One layer's K and V pools, [kv_heads, num_blocks, block_size, head_dim], of float32 or fp16 (Half) values.
template <typename T>
struct Pool {
  const T *k, *v;
  int64_t num_blocks, block_size, head_dim;
};

// y[i * y_stride + n - n0] for weight rows [n0, n1) and x rows [m, m + rows), rows <= MAX_ROWS.
using QuantMatmul = void (*)(const WeightRows& w, int64_t n0, int64_t n1, const QuantizedRows& x, int64_t m,
                             int64_t rows, float* y, int64_t y_stride);
// Prefill rows (prefill_gemm.h): y[m * y_stride + n - n0] for weight rows [n0, n1), n1 - n0 <= PREFILL_COLS, and
// all M rows of x [M, K], in the kernels' PrefillInput. Sums go over K in blocks of PREFILL_K, whatever M.
constexpr int64_t PREFILL_K = 256;
constexpr int64_t PREFILL_COLS = 128;
using PrefillMatmul = void (*)(const WeightRows& w, int64_t n0, int64_t n1, const void* x, int64_t rows, float* y,
                               int64_t y_stride);
// x as the kernels take it (the op converts it once a call): float32, float32 rounded to bf16, or bf16 (vdpbf16ps).
enum class PrefillInput { FLOAT32, ROUNDED_BFLOAT16, BFLOAT16 };
struct QuantKernels {  // the decode rows' integer matmuls, per format
  QuantMatmul q4, q4_g128, q4_k, q5_k, q6_k, q8, mxfp4, q5_0;
};
struct PrefillKernels {  // one precision's, per format
  PrefillMatmul q4, q4_g128, q4_k, q5_k, q6_k, q8, mxfp4, q5_0;
  PrefillInput input;
};
constexpr int64_t KEY_TILE = 32;    // attention: keys a tile, at absolute positions (attend.h)
// attention: query rows of one sequence in one work item. 8 keeps an item's tile work (its q rows, scores and output,
// the K and V tile: ~31 KB at head_dim 64 and 3 query heads a kv head) in a 48 KB L1; at 16 (~54 KB) a 2k-token
// prefill's attention ran 1.4x slower on Zen 5.
constexpr int64_t QUERY_TILE = 8;

// Query rows of one sequence for one kv head: row r's query heads at q + r * q_stride (head_dim apart),
// its output at out + r * out_stride; row r attends to keys [0, first_length + r).
struct QueryRows {
  const float* q;
  int64_t q_stride;
  float* out;
  int64_t out_stride, rows, first_length;
  int64_t window = 0;  // a sliding window: row r attends only to its last `window` keys (0: all of them)
  const float* sinks = nullptr;  // attention sinks: the group's query heads' logits, one more softmax term each
};

// Floats Attend's scratch holds: per query its scores and output, its max, sum and rescale factor (a vector's
// lanes past the last query too), then one K and one V tile in fp32 (where a decode row's fp16 tile is widened).
inline int64_t attend_scratch(int64_t rows, int64_t group, int64_t head_dim) {
  return rows * group * (KEY_TILE + head_dim) + 3 * (rows * group + MAX_LANES) + 2 * KEY_TILE * head_dim;
}

// The `group` query heads of each row on one kv head, keys read through `blocks` (attend.h).
template <typename T>
using Attend = void (*)(const Pool<T>& pool, int64_t kv_head, const int64_t* blocks, const QueryRows& rows,
                        int64_t group, float scale, float* scratch);

// The chunked delta rule (delta_chunks.h): one value head of one sequence's n prompt rows, row t's q and k at
// q + t * key_stride, its v at v + t * value_stride, g and beta at t * gate_stride, its output at out + t * out_stride;
// `state` [key dim, value dim] is read and left holding the state after the rows.
constexpr int64_t DELTA_CHUNK = 64;  // tokens a chunk: kernels/delta_rule_ref.py's CHUNK, the scheduler's grid
struct DeltaRuleHead {
  const float *q, *k, *v, *g, *beta;
  int64_t key_stride, value_stride, gate_stride;
  float *state, *out;
  int64_t out_stride, n, key_dim, value_dim;
};
inline int64_t delta_rule_scratch(int64_t key_dim, int64_t value_dim) {  // floats a head's call uses
  const int64_t c = DELTA_CHUNK;
  return 5 * c * key_dim + 3 * c * value_dim + 2 * c * c + c;
}
using DeltaRule = void (*)(const DeltaRuleHead& head, float* scratch);

struct Isa {
  const char* name;
  int64_t attend_lanes;  // Attend needs head_dim to be a multiple of this
  QuantKernels quant;
  Attend<float> attend;
  Attend<Half> attend_half;  // fp16 pools
  PrefillKernels prefill_float32, prefill_bfloat16;
  DeltaRule delta_rule;
};

const Isa& avx2();
const Isa& avx512();  // only where the CPU has AVX-512 F/BW/VL/DQ and VNNI
const Isa& active();  // dispatch.cpp: the set chosen at first use (set_isa)

}  // namespace inferplug_isa
