// Which instruction set's kernel table (kernels.h) the ops call: the best the CPU has, unless set_isa
// names another (kernels/cpu/__init__.py passes INFERPLUG_CPU_ISA; the tests and benches switch sets to
// compare them). Switch between calls, not during one.
#include <torch/library.h>

#include <atomic>
#include <string>

#include "kernels.h"

namespace inferplug_isa {
namespace {

bool has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni");
}

std::atomic<const Isa*> chosen{nullptr};

void set_isa(const std::string& name) {
  TORCH_CHECK(name == "avx2" || name == "avx512", "set_isa: the ISA must be avx2 or avx512, got '", name, "'");
  TORCH_CHECK(name == "avx2" || has_avx512(), "set_isa: this CPU lacks AVX-512 F/BW/VL/DQ with VNNI; use avx2");
  chosen.store(name == "avx2" ? &avx2() : &avx512());
}

std::string isa() { return active().name; }

}  // namespace

const Isa& active() {
  const Isa* isa = chosen.load(std::memory_order_relaxed);
  if (isa == nullptr) {
    isa = has_avx512() ? &avx512() : &avx2();
    chosen.store(isa);
  }
  return *isa;
}

}  // namespace inferplug_isa

TORCH_LIBRARY_FRAGMENT(inferplug, m) {
  m.def("set_isa(str name) -> ()", &inferplug_isa::set_isa);
  m.def("isa() -> str", &inferplug_isa::isa);
}
