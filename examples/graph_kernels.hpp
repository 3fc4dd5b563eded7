// Kernels of the graph capture example, callable from host code compiled without nvcc.
#pragma once

#include <cstdint>

namespace devrt::example {

/// One step of a small pipeline on n floats: h = relu(w * x + b); y = y + h.
void pipeline_step(const float* x, const float* w, const float* b, float* h, float* y, std::uint64_t n, void* stream);

}  // namespace devrt::example
