#include <cuda_runtime.h>

#include "inference_kernels.hpp"

namespace devrt::example {

namespace {

constexpr unsigned int threads_per_block = 256;

unsigned int blocks_for(std::uint64_t n) {
  const std::uint64_t b = (n + threads_per_block - 1) / threads_per_block;
  return static_cast<unsigned int>(b == 0 ? 1 : (b > 4096 ? 4096 : b));
}

__device__ std::uint64_t first_index() { return static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ std::uint64_t stride() { return static_cast<std::uint64_t>(gridDim.x) * blockDim.x; }

__global__ void fill_weights_kernel(std::uint32_t* w, std::uint64_t n, std::uint32_t key) {
  for (std::uint64_t j = first_index(); j < n; j += stride()) w[j] = weight_word(key, j);
}

__global__ void input_kernel(std::uint32_t* x, std::uint64_t n, std::uint32_t seed) {
  for (std::uint64_t i = first_index(); i < n; i += stride()) x[i] = pattern_word(seed, i);
}

__global__ void project_kernel(const std::uint32_t* x, const std::uint32_t* w, std::uint64_t weight_words,
                               std::uint32_t* h, std::uint64_t n) {
  for (std::uint64_t i = first_index(); i < n; i += stride()) {
    h[2 * i] = project0(x[i], w[(2 * i) % weight_words]);
    h[2 * i + 1] = project1(x[i], w[(2 * i + 1) % weight_words]);
  }
}

__global__ void reduce_kernel(const std::uint32_t* h, std::uint32_t* y, std::uint64_t n) {
  for (std::uint64_t i = first_index(); i < n; i += stride()) y[i] = reduce(h[2 * i], h[2 * i + 1]);
}

/// The keys of the model's layers, passed by value to the verify kernel.
struct layer_keys {
  std::uint32_t key[max_layers];
};

__global__ void verify_kernel(const std::uint32_t* y, std::uint64_t n, std::uint32_t seed, layer_keys keys,
                              std::uint32_t layers, std::uint64_t weight_words, unsigned long long* mismatches) {
  unsigned long long wrong = 0;
  for (std::uint64_t i = first_index(); i < n; i += stride()) {
    const std::uint64_t j0 = (2 * i) % weight_words;
    const std::uint64_t j1 = (2 * i + 1) % weight_words;
    wrong += y[i] != expected_output(seed, i, j0, j1, keys.key, layers) ? 1 : 0;
  }
  if (wrong != 0) atomicAdd(mismatches, wrong);
}

__global__ void probe_fill_kernel(std::uint32_t* p, std::uint64_t n, std::uint32_t seed) {
  for (std::uint64_t k = first_index(); k < probe_count(n); k += stride()) {
    const std::uint64_t i = probe_index(n, k);
    p[i] = pattern_word(seed, i);
  }
}

__global__ void probe_check_kernel(const std::uint32_t* p, std::uint64_t n, std::uint32_t seed,
                                   unsigned long long* mismatches) {
  unsigned long long wrong = 0;
  for (std::uint64_t k = first_index(); k < probe_count(n); k += stride()) {
    const std::uint64_t i = probe_index(n, k);
    wrong += p[i] != pattern_word(seed, i) ? 1 : 0;
  }
  if (wrong != 0) atomicAdd(mismatches, wrong);
}

const char* launched() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace

const char* cuda_fill_weights(std::uint32_t* w, std::uint64_t n, std::uint32_t model, std::uint32_t layer,
                              void* stream) {
  fill_weights_kernel<<<blocks_for(n), threads_per_block, 0, static_cast<cudaStream_t>(stream)>>>(
      w, n, layer_key(model, layer));
  return launched();
}

const char* cuda_input(std::uint32_t* x, std::uint64_t n, std::uint32_t seed, void* stream) {
  input_kernel<<<blocks_for(n), threads_per_block, 0, static_cast<cudaStream_t>(stream)>>>(x, n, seed);
  return launched();
}

const char* cuda_layer(const std::uint32_t* x, const std::uint32_t* w, std::uint64_t weight_words, std::uint32_t* h,
                       std::uint32_t* y, std::uint64_t n, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  project_kernel<<<blocks_for(n), threads_per_block, 0, s>>>(x, w, weight_words, h, n);
  if (const char* e = launched()) return e;
  reduce_kernel<<<blocks_for(n), threads_per_block, 0, s>>>(h, y, n);
  return launched();
}

const char* cuda_verify(const std::uint32_t* y, std::uint64_t n, std::uint32_t seed, std::uint32_t model,
                        std::uint32_t layers, std::uint64_t weight_words, unsigned long long* mismatches,
                        void* stream) {
  if (layers > max_layers) return "too many layers";
  layer_keys keys{};
  for (std::uint32_t l = 0; l < layers; ++l) keys.key[l] = layer_key(model, l);
  verify_kernel<<<blocks_for(n), threads_per_block, 0, static_cast<cudaStream_t>(stream)>>>(y, n, seed, keys, layers,
                                                                                            weight_words, mismatches);
  return launched();
}

const char* cuda_probe_fill(std::uint32_t* p, std::uint64_t n, std::uint32_t seed, void* stream) {
  if (n == 0) return nullptr;
  probe_fill_kernel<<<blocks_for(probe_count(n)), threads_per_block, 0, static_cast<cudaStream_t>(stream)>>>(p, n,
                                                                                                             seed);
  return launched();
}

const char* cuda_probe_check(const std::uint32_t* p, std::uint64_t n, std::uint32_t seed,
                             unsigned long long* mismatches, void* stream) {
  if (n == 0) return nullptr;
  probe_check_kernel<<<blocks_for(probe_count(n)), threads_per_block, 0, static_cast<cudaStream_t>(stream)>>>(
      p, n, seed, mismatches);
  return launched();
}

const char* cuda_when_done(void* stream, void (*fn)(void*), void* arg) {
  const cudaError_t e = cudaLaunchHostFunc(static_cast<cudaStream_t>(stream), fn, arg);
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

const char* cuda_stream_create(void** out) {
  cudaStream_t s = nullptr;
  const cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  *out = s;
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

void cuda_stream_destroy(void* stream) { cudaStreamDestroy(static_cast<cudaStream_t>(stream)); }

}  // namespace devrt::example
