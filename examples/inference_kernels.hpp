// The arithmetic of the inference examples' toy model, for the host device and for CUDA devices.
//
// The model works on 32-bit words with wrapping arithmetic, so the host and the GPU compute the
// same bits and an output can be checked exactly. A request's input is derived from its seed; a
// layer turns an activation x of n words into a scratch buffer h of 2n words (two projections of
// x with the layer's weights) and reduces h into the next activation y of n words. The expected
// output of element i depends only on the seed, i and the weight formula, so a check needs no copy
// of the intermediate results.
//
// This header is read by the host compiler (C++20) and by nvcc (C++17): it includes nothing of
// devrt. The CUDA launchers are declared only when the examples are built with CUDA.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DEVRT_EXAMPLE_HD __host__ __device__
#else
#define DEVRT_EXAMPLE_HD
#endif

namespace devrt::example {

// ---- The formulas ----

DEVRT_EXAMPLE_HD inline std::uint32_t mix32(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

DEVRT_EXAMPLE_HD inline std::uint32_t index_hash(std::uint64_t i) {
  return mix32(static_cast<std::uint32_t>(i) + static_cast<std::uint32_t>(i >> 32) * 0x9e3779b9U);
}

/// Word i of a request's input (or of any buffer filled with a pattern from `seed`).
DEVRT_EXAMPLE_HD inline std::uint32_t pattern_word(std::uint32_t seed, std::uint64_t i) {
  return mix32(seed ^ index_hash(i));
}

/// The key of the weights of `layer` of the model `model`, and word j of those weights
/// (j < 2^32: a layer has at most hidden^2 words).
DEVRT_EXAMPLE_HD inline std::uint32_t layer_key(std::uint32_t model, std::uint32_t layer) {
  return mix32(model * 0x85ebca6bU + layer * 0xc2b2ae35U + 1U);
}
DEVRT_EXAMPLE_HD inline std::uint32_t weight_word(std::uint32_t key, std::uint64_t j) {
  return mix32(key ^ static_cast<std::uint32_t>(j));
}

/// The two projections of an input word.
DEVRT_EXAMPLE_HD inline std::uint32_t project0(std::uint32_t v, std::uint32_t w) { return v * 3U + w; }
DEVRT_EXAMPLE_HD inline std::uint32_t project1(std::uint32_t v, std::uint32_t w) { return v * 5U + w; }
/// The reduction of the two projections into the output word.
DEVRT_EXAMPLE_HD inline std::uint32_t reduce(std::uint32_t a, std::uint32_t b) { return a + ((b << 7) | (b >> 25)); }

/// The output word i after the layers whose keys are `keys[0..layers)` applied to the input of
/// `seed`. Element i reads the weight words j0 = 2i mod W and j1 = (2i + 1) mod W of every layer
/// (W words a layer).
DEVRT_EXAMPLE_HD inline std::uint32_t expected_output(std::uint32_t seed, std::uint64_t i, std::uint64_t j0,
                                                      std::uint64_t j1, const std::uint32_t* keys,
                                                      std::uint32_t layers) {
  std::uint32_t v = pattern_word(seed, i);
  for (std::uint32_t l = 0; l < layers; ++l) {
    v = reduce(project0(v, weight_word(keys[l], j0)), project1(v, weight_word(keys[l], j1)));
  }
  return v;
}

/// Most layers a model may have (the checks keep one key a layer).
inline constexpr std::uint32_t max_layers = 64;

/// Probed buffers (allocations of a trace): the first and last `probe_words` words carry a
/// pattern, or the whole buffer when it is smaller than both.
inline constexpr std::uint64_t probe_words = 4096;
DEVRT_EXAMPLE_HD inline std::uint64_t probe_count(std::uint64_t n) {
  return n <= 2 * probe_words ? n : 2 * probe_words;
}
DEVRT_EXAMPLE_HD inline std::uint64_t probe_index(std::uint64_t n, std::uint64_t p) {
  return n <= 2 * probe_words || p < probe_words ? p : n - 2 * probe_words + p;
}

// ---- Host versions (the host device runs them on its strand) ----

inline void host_fill_weights(std::uint32_t* w, std::uint64_t n, std::uint32_t model, std::uint32_t layer) {
  const std::uint32_t key = layer_key(model, layer);
  for (std::uint64_t j = 0; j < n; ++j) w[j] = weight_word(key, j);
}

inline void host_input(std::uint32_t* x, std::uint64_t n, std::uint32_t seed) {
  for (std::uint64_t i = 0; i < n; ++i) x[i] = pattern_word(seed, i);
}

inline void host_layer(const std::uint32_t* x, const std::uint32_t* w, std::uint64_t weight_words, std::uint32_t* h,
                       std::uint32_t* y, std::uint64_t n) {
  std::uint64_t j = 0;  // 2i mod weight_words, without a division per element
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint64_t j1 = j + 1 == weight_words ? 0 : j + 1;
    h[2 * i] = project0(x[i], w[j]);
    h[2 * i + 1] = project1(x[i], w[j1]);
    j = j1 + 1 == weight_words ? 0 : j1 + 1;
  }
  for (std::uint64_t i = 0; i < n; ++i) y[i] = reduce(h[2 * i], h[2 * i + 1]);
}

/// Number of output words that differ from the expected output.
inline std::uint64_t host_verify(const std::uint32_t* y, std::uint64_t n, std::uint32_t seed, std::uint32_t model,
                                 std::uint32_t layers, std::uint64_t weight_words) {
  if (layers > max_layers) return n;
  std::uint32_t keys[max_layers];
  for (std::uint32_t l = 0; l < layers; ++l) keys[l] = layer_key(model, l);
  std::uint64_t wrong = 0;
  std::uint64_t j = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint64_t j1 = j + 1 == weight_words ? 0 : j + 1;
    wrong += y[i] != expected_output(seed, i, j, j1, keys, layers) ? 1 : 0;
    j = j1 + 1 == weight_words ? 0 : j1 + 1;
  }
  return wrong;
}

inline void host_probe_fill(std::uint32_t* p, std::uint64_t n, std::uint32_t seed) {
  for (std::uint64_t k = 0; k < probe_count(n); ++k) {
    const std::uint64_t i = probe_index(n, k);
    p[i] = pattern_word(seed, i);
  }
}

inline std::uint64_t host_probe_check(const std::uint32_t* p, std::uint64_t n, std::uint32_t seed) {
  std::uint64_t wrong = 0;
  for (std::uint64_t k = 0; k < probe_count(n); ++k) {
    const std::uint64_t i = probe_index(n, k);
    wrong += p[i] != pattern_word(seed, i) ? 1 : 0;
  }
  return wrong;
}

// ---- CUDA launchers (inference_kernels.cu) ----
//
// Each enqueues its kernel on `stream` (a cudaStream_t) and returns nullptr, or the CUDA error's
// text when the launch failed. Mismatch counters are device words that the kernels add to.
// Without CUDA (DEVRT_EXAMPLE_CUDA undefined) they are stubs that report it, so that host code
// compiles unchanged.
#if defined(DEVRT_EXAMPLE_CUDA) || defined(__CUDACC__)

const char* cuda_fill_weights(std::uint32_t* w, std::uint64_t n, std::uint32_t model, std::uint32_t layer,
                              void* stream);
const char* cuda_input(std::uint32_t* x, std::uint64_t n, std::uint32_t seed, void* stream);
const char* cuda_layer(const std::uint32_t* x, const std::uint32_t* w, std::uint64_t weight_words, std::uint32_t* h,
                       std::uint32_t* y, std::uint64_t n, void* stream);
const char* cuda_verify(const std::uint32_t* y, std::uint64_t n, std::uint32_t seed, std::uint32_t model,
                        std::uint32_t layers, std::uint64_t weight_words, unsigned long long* mismatches, void* stream);
const char* cuda_probe_fill(std::uint32_t* p, std::uint64_t n, std::uint32_t seed, void* stream);
const char* cuda_probe_check(const std::uint32_t* p, std::uint64_t n, std::uint32_t seed,
                             unsigned long long* mismatches, void* stream);
/// Calls `fn(arg)` on a CUDA thread once the work enqueued on `stream` before it has finished.
/// `fn` must not call CUDA.
const char* cuda_when_done(void* stream, void (*fn)(void*), void* arg);
/// A non-blocking stream of the calling worker's own on device 0 (*out), and its destruction.
const char* cuda_stream_create(void** out);
void cuda_stream_destroy(void* stream);

#else

// Built without CUDA: no CUDA device is ever selected, so these are never called.
inline constexpr const char* no_cuda = "this build has no CUDA support";
inline const char* cuda_fill_weights(std::uint32_t*, std::uint64_t, std::uint32_t, std::uint32_t, void*) {
  return no_cuda;
}
inline const char* cuda_input(std::uint32_t*, std::uint64_t, std::uint32_t, void*) { return no_cuda; }
inline const char* cuda_layer(const std::uint32_t*, const std::uint32_t*, std::uint64_t, std::uint32_t*, std::uint32_t*,
                              std::uint64_t, void*) {
  return no_cuda;
}
inline const char* cuda_verify(const std::uint32_t*, std::uint64_t, std::uint32_t, std::uint32_t, std::uint32_t,
                               std::uint64_t, unsigned long long*, void*) {
  return no_cuda;
}
inline const char* cuda_probe_fill(std::uint32_t*, std::uint64_t, std::uint32_t, void*) { return no_cuda; }
inline const char* cuda_probe_check(const std::uint32_t*, std::uint64_t, std::uint32_t, unsigned long long*, void*) {
  return no_cuda;
}
inline const char* cuda_when_done(void*, void (*)(void*), void*) { return no_cuda; }
inline const char* cuda_stream_create(void**) { return no_cuda; }
inline void cuda_stream_destroy(void*) {}

#endif

}  // namespace devrt::example
