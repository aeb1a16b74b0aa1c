// The AVX2 kernel table: the templates at 256 bits with AVX2's u8 x s8 multiply-adds.
#include "attend.h"
#include "delta_chunks.h"
#include "prefill_gemm.h"
#include "quant_dot.h"

namespace inferplug_isa {

const Isa& avx2() {
  using Float = FloatPanel<F256, false>;
  using Bf16 = FloatPanel<F256, true>;  // AVX2 has no bf16 dot product: FMAs on bf16-rounded values
  static const Isa isa{"avx2", F256::LANES, quant_kernels<DotAvx2>(), &attend<F256, float>,
                       &attend<F256, Half>, prefill_kernels<Float>(PrefillInput::FLOAT32),
                       prefill_kernels<Bf16>(PrefillInput::ROUNDED_BFLOAT16), &delta_rule_head<F256>};
  return isa;
}

}  // namespace inferplug_isa
