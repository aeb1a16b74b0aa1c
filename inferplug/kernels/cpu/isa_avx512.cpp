// The AVX-512 kernel table: the same templates as isa_avx2.cpp, compiled for AVX-512 F/BW/VL/DQ + VNNI.
// Only this file holds AVX-512 code, and it includes no torch header: an inline torch or library function
// compiled here could be the copy the linker keeps, and crash AVX2 hosts. So the standard headers come
// before the target pragma (their functions keep the build's AVX2 flags), and the templates live in
// anonymous namespaces (their copies here are this file's own).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels.h"

#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
#define INFERPLUG_AVX512  // the headers' AVX-512 parts (GCC defines no __AVX512F__ for a pragma)
#include "attend.h"
#include "delta_chunks.h"
#include "prefill_gemm.h"
#include "quant_dot.h"

namespace inferplug_isa {

// vdpbf16ps for the bf16 prefill where the CPU has AVX512_BF16 (Zen 4, Sapphire Rapids; not Ice Lake), else FMAs on
// bf16-rounded values.
static bool has_bf16() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16");
}

// Per kernel the width that measured faster here (bench/cpu_kernels_isa.py, Zen 4): the integer matmuls
// and paged decode at 512 bits.
const Isa& avx512() {
  using Float = FloatPanel<F512, false>;
  using Rounded = FloatPanel<F512, true>;
  const bool dot = has_bf16();
  static const Isa isa{"avx512-vnni", F512::LANES, quant_kernels<DotVnni<I512>>(), &attend<F512, float>, &attend<F512, Half>, prefill_kernels<Float>(PrefillInput::FLOAT32),
                       dot ? prefill_kernels<Bf16Panel>(PrefillInput::BFLOAT16)
                           : prefill_kernels<Rounded>(PrefillInput::ROUNDED_BFLOAT16),
                       &delta_rule_head<F512>};
  return isa;
}

}  // namespace inferplug_isa
