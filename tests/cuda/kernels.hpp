// Kernels used by the CUDA tests, callable from host code compiled without nvcc. `stream` is a
// cudaStream_t.
#pragma once

#include <cstdint>

namespace devrt::test_kernels {

/// Writes the pattern of `seed` into `bytes` bytes at `ptr` (bytes a multiple of 4).
void fill_pattern(void* ptr, std::uint64_t bytes, std::uint32_t seed, void* stream);
/// Adds to `*mismatches` (device memory) the number of 4-byte words that differ from the pattern.
void check_pattern(const void* ptr, std::uint64_t bytes, std::uint32_t seed, unsigned int* mismatches, void* stream);
/// y[i] = a * x[i] + y[i] over n floats.
void saxpy(float a, const float* x, float* y, std::uint64_t n, void* stream);
/// out[i] = in[i] * in[i] over n floats.
void square(const float* in, float* out, std::uint64_t n, void* stream);
/// Keeps `stream` busy for about `microseconds` (one thread spinning on the GPU's clock).
void spin(std::uint64_t microseconds, void* stream);
/// Spins for `microseconds`, then adds the words of `bytes` at `ptr` that differ from the pattern
/// of `seed` to `*mismatches`: a kernel still reading the memory long after it was launched.
void spin_then_check(const void* ptr, std::uint64_t bytes, std::uint32_t seed, std::uint64_t microseconds,
                     unsigned int* mismatches, void* stream);
/// Spins for `microseconds`, then fills `bytes` at `ptr` with the pattern of `seed`.
void spin_then_fill(void* ptr, std::uint64_t bytes, std::uint32_t seed, std::uint64_t microseconds, void* stream);
/// Last launch error name, or nullptr when the last launch succeeded.
const char* last_error();

}  // namespace devrt::test_kernels
