// The C interface on a GPU, as a framework uses it: streams by cudaStream_t (NULL the legacy
// stream), frees in stream order with kernels still running, streams destroyed with work queued,
// empty_cache beside a busy stream, record_stream errors, CUDA indices and DEVRT_CUDA_DEVICES.
// Built against devrt/c_api.h and libdevrt_c.so only.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "devrt/c_api.h"
#include "kernels.hpp"
#include "mismatch_counter.hpp"

namespace {

#define REQUIRE_GPU()                                             \
  do {                                                            \
    int n = 0;                                                    \
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {        \
      cudaGetLastError();                                         \
      GTEST_SKIP() << "CUDA test skipped: no usable CUDA device"; \
    }                                                             \
  } while (false)

constexpr std::size_t big = std::size_t{64} << 20;

cudaStream_t new_stream() {
  cudaStream_t s = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  return s;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// devrt started afresh with the environment as it is now.
struct started {
  started() {
    devrt_shutdown();
    EXPECT_EQ(devrt_init(nullptr), DEVRT_SUCCESS) << devrt_last_error();
  }
  started(const started&) = delete;
  started& operator=(const started&) = delete;
  ~started() { devrt_shutdown(); }
};

}  // namespace

// The review's g1, case 1 (finding B1): devrt_empty_cache beside a side stream whose kernel still
// writes the freed memory.
TEST(CApiStreams, EmptyCacheBesideABusyStreamHandsOutNothingEarly) {
  REQUIRE_GPU();
  started devrt;
  cudaStream_t a = new_stream();
  cudaStream_t b = new_stream();
  void* anchor = nullptr;
  ASSERT_EQ(devrt_malloc(&anchor, 4096, 0, b), DEVRT_SUCCESS) << devrt_last_error();
  void* x = nullptr;
  ASSERT_EQ(devrt_malloc(&x, big, 0, a), DEVRT_SUCCESS) << devrt_last_error();
  devrt::test_kernels::spin_then_fill(x, big, 1, 1'000'000, a);
  ASSERT_EQ(devrt_free(x, 0, a), DEVRT_SUCCESS);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(devrt_empty_cache(0), DEVRT_SUCCESS);
  const double cleanup = ms_since(t0);
  void* y = nullptr;
  ASSERT_EQ(devrt_malloc(&y, big, 0, b), DEVRT_SUCCESS) << devrt_last_error();
  devrt::test_kernels::fill_pattern(y, big, 2, b);
  ASSERT_EQ(cudaStreamSynchronize(b), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(a), cudaSuccess);
  mismatch_counter bad;
  devrt::test_kernels::check_pattern(y, big, 2, bad.d, b);
  const unsigned wrong = bad.value();
  std::printf("[ g1 case 1] C: empty_cache %.2f ms; y == x: %s; words of y that are not 2: %u\n", cleanup,
              y == x ? "yes" : "no", wrong);
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(devrt_free(y, 0, b), DEVRT_SUCCESS);
  EXPECT_EQ(devrt_free(anchor, 0, b), DEVRT_SUCCESS);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

// peak_busy_bytes: memory freed on a stream whose kernel still runs is busy beside what is in use,
// once an allocation on another stream needs new memory; a version 3 caller never sees the field.
TEST(CApiStreams, ThePeakOfBusyMemoryCountsMemoryAKernelStillUses) {
  REQUIRE_GPU();
  started devrt;
  cudaStream_t a = new_stream();
  cudaStream_t b = new_stream();
  void* anchor = nullptr;
  ASSERT_EQ(devrt_malloc(&anchor, 4096, 0, a), DEVRT_SUCCESS) << devrt_last_error();
  void* x = nullptr;
  ASSERT_EQ(devrt_malloc(&x, big, 0, b), DEVRT_SUCCESS) << devrt_last_error();
  devrt::test_kernels::spin_then_fill(x, big, 1, 500'000, b);
  ASSERT_EQ(devrt_free(x, 0, b), DEVRT_SUCCESS);
  void* y = nullptr;
  ASSERT_EQ(devrt_malloc(&y, 4 * big, 0, a), DEVRT_SUCCESS) << devrt_last_error();  // new memory
  const bool still_running = cudaStreamQuery(b) == cudaErrorNotReady;
  devrt_stats st{};
  ASSERT_EQ(devrt_get_stats_v(0, &st, 4), DEVRT_SUCCESS) << devrt_last_error();
  std::printf("peak in use %llu, peak busy %llu, peak reserved %llu; b still running: %s\n",
              static_cast<unsigned long long>(st.peak_in_use_bytes),
              static_cast<unsigned long long>(st.peak_busy_bytes),
              static_cast<unsigned long long>(st.peak_reserved_bytes), still_running ? "yes" : "no");
  if (still_running) {
    EXPECT_GE(st.peak_busy_bytes, 4096 + 4 * big + big) << "x, which b's kernel still fills, counts beside a and y";
  }
  EXPECT_GE(st.peak_busy_bytes, st.peak_in_use_bytes);
  EXPECT_LE(st.peak_busy_bytes, st.peak_reserved_bytes);
  devrt_stats old{};
  old.peak_busy_bytes = 0xDEAD;
  ASSERT_EQ(devrt_get_stats_v(0, &old, 3), DEVRT_SUCCESS);
  EXPECT_EQ(old.peak_busy_bytes, 0xDEADu) << "version 3 has no peak_busy_bytes";
  ASSERT_EQ(cudaStreamSynchronize(b), cudaSuccess);
  EXPECT_EQ(devrt_free(y, 0, a), DEVRT_SUCCESS);
  EXPECT_EQ(devrt_free(anchor, 0, a), DEVRT_SUCCESS);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

// The review's g1, case 2 (finding B3): a stream destroyed with its kernel still writing freed
// memory, and a new stream that gets the same handle.
TEST(CApiStreams, AStreamDestroyedWithWorkQueuedNeverLendsItsMemoryToTheNextStream) {
  REQUIRE_GPU();
  started devrt;
  cudaStream_t b = new_stream();
  void* anchor = nullptr;
  ASSERT_EQ(devrt_malloc(&anchor, 4096, 0, b), DEVRT_SUCCESS);
  cudaStream_t c = new_stream();
  void* z = nullptr;
  ASSERT_EQ(devrt_malloc(&z, big, 0, c), DEVRT_SUCCESS) << devrt_last_error();
  devrt::test_kernels::spin_then_fill(z, big, 3, 1'000'000, c);
  ASSERT_EQ(devrt_free(z, 0, c), DEVRT_SUCCESS);
  ASSERT_EQ(cudaStreamDestroy(c), cudaSuccess);
  cudaStream_t d = new_stream();
  void* w = nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  const int r = devrt_malloc(&w, big, 0, d);
  const double reserve = ms_since(t0);
  ASSERT_EQ(r, DEVRT_SUCCESS) << devrt_last_error();
  devrt::test_kernels::fill_pattern(w, big, 4, d);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  mismatch_counter bad;
  devrt::test_kernels::check_pattern(w, big, 4, bad.d, d);
  const unsigned wrong = bad.value();
  std::printf(
      "[ g1 case 2] C: new stream reuses the handle: %s; malloc %s in %.2f ms; w == z: %s; words of w "
      "that are not 4: %u\n",
      d == c ? "yes" : "no", devrt_status_name(r), reserve, w == z ? "yes" : "no", wrong);
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(devrt_free(w, 0, d), DEVRT_SUCCESS);
  EXPECT_EQ(devrt_free(anchor, 0, b), DEVRT_SUCCESS);
  cudaStreamDestroy(d);
  cudaStreamDestroy(b);
}

// NULL is CUDA's legacy stream, as everywhere in CUDA: memory freed on it and reused by another
// stream only after the legacy stream's work is done.
TEST(CApiStreams, NullIsTheLegacyStream) {
  REQUIRE_GPU();
  started devrt;
  cudaStream_t b = new_stream();
  void* x = nullptr;
  ASSERT_EQ(devrt_malloc(&x, big, 0, nullptr), DEVRT_SUCCESS) << devrt_last_error();
  devrt::test_kernels::spin_then_fill(x, big, 7, 500'000, nullptr);  // on the legacy stream
  ASSERT_EQ(devrt_free(x, 0, nullptr), DEVRT_SUCCESS);
  void* y = nullptr;
  ASSERT_EQ(devrt_malloc(&y, big, 0, b), DEVRT_SUCCESS) << devrt_last_error();
  devrt::test_kernels::fill_pattern(y, big, 8, b);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  mismatch_counter bad;
  devrt::test_kernels::check_pattern(y, big, 8, bad.d, b);
  EXPECT_EQ(bad.value(), 0u) << "memory freed on the legacy stream went to another stream early";
  EXPECT_EQ(devrt_free(y, 0, b), DEVRT_SUCCESS);
  void* own = nullptr;
  EXPECT_EQ(devrt_malloc(&own, 4096, 0, DEVRT_STREAM_DEVICE), DEVRT_SUCCESS);
  EXPECT_EQ(devrt_free(own, 0, DEVRT_STREAM_DEVICE), DEVRT_SUCCESS);
  cudaStreamDestroy(b);
}

// failed_allocations counts calls that failed: one per refused devrt_malloc, none for one that
// succeeds after devrt reclaimed memory, none for a rejected argument.
TEST(CApiStreams, FailedAllocationsCountRefusedCalls) {
  REQUIRE_GPU();
  started devrt;
  devrt_stats before{};
  ASSERT_EQ(devrt_get_stats(0, &before), DEVRT_SUCCESS);
  void* p = nullptr;
  EXPECT_EQ(devrt_malloc(&p, std::size_t{1} << 50, 0, nullptr), DEVRT_ERROR_NO_POOL);  // larger than the device
  EXPECT_EQ(devrt_malloc(&p, DEVRT_MAX_ALLOCATION_SIZE + 1, 0, nullptr), DEVRT_ERROR_SIZE_TOO_LARGE);
  devrt_stats after{};
  ASSERT_EQ(devrt_get_stats(0, &after), DEVRT_SUCCESS);
  EXPECT_EQ(after.failed_allocations - before.failed_allocations, 1u);
}

// Device indices are CUDA's; DEVRT_CUDA_DEVICES chooses among them, and only a device a call names
// is started.
TEST(CApiStreams, DevicesAreCudaIndicesAndOnlyTheOnesUsedStart) {
  REQUIRE_GPU();
  int n = 0;
  ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
  const int chosen = n - 1;  // the last GPU only
  setenv("DEVRT_CUDA_DEVICES", std::to_string(chosen).c_str(), 1);
  {
    started devrt;
    void* p = nullptr;
    EXPECT_EQ(devrt_malloc(&p, 4096, chosen, nullptr), DEVRT_SUCCESS) << devrt_last_error();
    EXPECT_EQ(devrt_free(p, chosen, nullptr), DEVRT_SUCCESS);
    if (n > 1) {
      EXPECT_EQ(devrt_malloc(&p, 4096, 0, nullptr), DEVRT_ERROR_INVALID_DEVICE);
      std::printf("[ devices  ] C: %s\n", devrt_last_error());
    }
    EXPECT_EQ(devrt_malloc(&p, 4096, n, nullptr), DEVRT_ERROR_INVALID_DEVICE);
    int count = 0;
    EXPECT_EQ(devrt_device_count(&count), DEVRT_SUCCESS);
    EXPECT_EQ(count, n);
  }
  unsetenv("DEVRT_CUDA_DEVICES");
}
