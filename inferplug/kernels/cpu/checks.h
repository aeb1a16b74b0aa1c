// Argument checks the kernels share.
#pragma once
#include <ATen/ATen.h>

namespace checks {

inline void float_cpu(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.device().is_cpu(), op, ": ", name,
              " must be a contiguous float32 CPU tensor");
}

}  // namespace checks
