// The AVX2 kernel table: the templates at 256 bits with AVX2's u8 x s8 multiply-adds.
#include "attend.h"
#include "quant_dot.h"

namespace inferplug_isa {

const Isa& avx2() {
  static const Isa isa{"avx2", F256::LANES, &quant_matmul_rows<DotAvx2, Q4_1>, &quant_matmul_rows<DotAvx2, Q8_0>,
                       &float_matmul_rows<F256>, &attend<F256, float>, &attend<F256, Half>};
  return isa;
}

}  // namespace inferplug_isa
