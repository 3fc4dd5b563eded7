#include "kernels.hpp"

#include <cuda_runtime.h>

namespace devrt::test_kernels {

namespace {

__device__ __forceinline__ std::uint32_t pattern(std::uint32_t seed, std::uint64_t i) {
  std::uint64_t x = (static_cast<std::uint64_t>(seed) << 32) ^ (i * 0x9E3779B97F4A7C15ULL);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ULL;
  return static_cast<std::uint32_t>(x ^ (x >> 32));
}

__global__ void fill_kernel(std::uint32_t* p, std::uint64_t words, std::uint32_t seed) {
  for (std::uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words; i += gridDim.x * blockDim.x) {
    p[i] = pattern(seed, i);
  }
}

__global__ void check_kernel(const std::uint32_t* p, std::uint64_t words, std::uint32_t seed, unsigned int* bad) {
  unsigned int local = 0;
  for (std::uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words; i += gridDim.x * blockDim.x) {
    local += p[i] != pattern(seed, i) ? 1U : 0U;
  }
  if (local != 0) atomicAdd(bad, local);
}

__global__ void saxpy_kernel(float a, const float* x, float* y, std::uint64_t n) {
  for (std::uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    y[i] = a * x[i] + y[i];
  }
}

__global__ void square_kernel(const float* in, float* out, std::uint64_t n) {
  for (std::uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    out[i] = in[i] * in[i];
  }
}

__device__ void spin_for(std::uint64_t microseconds) {
  std::uint64_t start = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  for (;;) {
    std::uint64_t now = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start >= microseconds * 1000) break;
    __nanosleep(1000);
  }
}

__global__ void spin_kernel(std::uint64_t microseconds) { spin_for(microseconds); }

__global__ void spin_check_kernel(const std::uint32_t* p, std::uint64_t words, std::uint32_t seed,
                                  std::uint64_t microseconds, unsigned int* bad) {
  // Every block spins, so that the whole grid reads the memory only at the end.
  if (threadIdx.x == 0) spin_for(microseconds);
  __syncthreads();
  unsigned int local = 0;
  for (std::uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words; i += gridDim.x * blockDim.x) {
    local += p[i] != pattern(seed, i) ? 1U : 0U;
  }
  if (local != 0) atomicAdd(bad, local);
}

__global__ void spin_fill_kernel(std::uint32_t* p, std::uint64_t words, std::uint32_t seed,
                                 std::uint64_t microseconds) {
  if (threadIdx.x == 0) spin_for(microseconds);
  __syncthreads();
  for (std::uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words; i += gridDim.x * blockDim.x) {
    p[i] = pattern(seed, i);
  }
}

unsigned int blocks_for(std::uint64_t n) {
  const std::uint64_t b = (n + 255) / 256;
  return static_cast<unsigned int>(b == 0 ? 1 : (b > 4096 ? 4096 : b));
}

}  // namespace

void fill_pattern(void* ptr, std::uint64_t bytes, std::uint32_t seed, void* stream) {
  const std::uint64_t words = bytes / 4;
  fill_kernel<<<blocks_for(words), 256, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<std::uint32_t*>(ptr), words,
                                                                                seed);
}

void check_pattern(const void* ptr, std::uint64_t bytes, std::uint32_t seed, unsigned int* mismatches, void* stream) {
  const std::uint64_t words = bytes / 4;
  check_kernel<<<blocks_for(words), 256, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<const std::uint32_t*>(ptr),
                                                                                 words, seed, mismatches);
}

void saxpy(float a, const float* x, float* y, std::uint64_t n, void* stream) {
  saxpy_kernel<<<blocks_for(n), 256, 0, static_cast<cudaStream_t>(stream)>>>(a, x, y, n);
}

void square(const float* in, float* out, std::uint64_t n, void* stream) {
  square_kernel<<<blocks_for(n), 256, 0, static_cast<cudaStream_t>(stream)>>>(in, out, n);
}

void spin(std::uint64_t microseconds, void* stream) {
  spin_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(microseconds);
}

void spin_then_check(const void* ptr, std::uint64_t bytes, std::uint32_t seed, std::uint64_t microseconds,
                     unsigned int* mismatches, void* stream) {
  const std::uint64_t words = bytes / 4;
  // Few blocks: they all wait, and they must all be resident at once to finish together.
  const unsigned int blocks = blocks_for(words) > 64 ? 64 : blocks_for(words);
  spin_check_kernel<<<blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<const std::uint32_t*>(ptr),
                                                                           words, seed, microseconds, mismatches);
}

void spin_then_fill(void* ptr, std::uint64_t bytes, std::uint32_t seed, std::uint64_t microseconds, void* stream) {
  const std::uint64_t words = bytes / 4;
  const unsigned int blocks = blocks_for(words) > 64 ? 64 : blocks_for(words);
  spin_fill_kernel<<<blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<std::uint32_t*>(ptr), words, seed,
                                                                          microseconds);
}

const char* last_error() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorName(e);
}

}  // namespace devrt::test_kernels
