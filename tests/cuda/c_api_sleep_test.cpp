// Sleep and wake on a GPU through the C interface, with the streams busy: a sleep issued while a
// kernel still writes the tagged memory keeps what the kernel wrote, gives the memory back to the
// device (cudaMemGetInfo), and the wake restores it at the same address; a wake without room
// fails with OUT_OF_MEMORY, stays asleep, and succeeds once room is made; a second sleep copies
// into the pinned memory the first one left, behind a kernel still writing, while another stream
// runs a kernel on untagged memory.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>

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

constexpr std::size_t big = std::size_t{256} << 20;

struct started {
  started() {
    devrt_shutdown();
    EXPECT_EQ(devrt_init(nullptr), DEVRT_SUCCESS) << devrt_last_error();
  }
  started(const started&) = delete;
  started& operator=(const started&) = delete;
  ~started() {
    devrt_set_tag(nullptr);
    devrt_shutdown();
  }
};

std::size_t device_free() {
  std::size_t f = 0;
  std::size_t t = 0;
  EXPECT_EQ(cudaMemGetInfo(&f, &t), cudaSuccess);
  return f;
}

}  // namespace

TEST(CApiSleep, KeepsWhatAKernelStillWritingLeftAndGivesTheMemoryBack) {
  REQUIRE_GPU();
  started devrt;
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(devrt_set_tag("cuda.weights"), DEVRT_SUCCESS);
  void* p = nullptr;
  ASSERT_EQ(devrt_malloc(&p, big, 0, s), DEVRT_SUCCESS) << devrt_last_error();
  ASSERT_EQ(devrt_set_tag(nullptr), DEVRT_SUCCESS);
  devrt::test_kernels::spin_then_fill(p, big, 42, 300'000, s);  // still writing when the sleep comes
  const std::size_t before = device_free();
  ASSERT_EQ(devrt_sleep(0, "cuda.weights", 1), DEVRT_SUCCESS) << devrt_last_error();
  const std::size_t asleep = device_free();
  EXPECT_GE(asleep, before + big * 95 / 100) << "the tag's memory is back with the device";
  devrt_stats st{};
  ASSERT_EQ(devrt_get_stats(0, &st), DEVRT_SUCCESS);
  EXPECT_GE(st.sleeping_bytes, big);
  EXPECT_GE(st.offloaded_bytes, big);
  ASSERT_EQ(devrt_wake(0, "cuda.weights"), DEVRT_SUCCESS) << devrt_last_error();
  mismatch_counter bad;
  devrt::test_kernels::check_pattern(p, big, 42, bad.d, s);
  EXPECT_EQ(bad.value(), 0u) << "the bytes the kernel wrote before the sleep are back at the same address";
  EXPECT_EQ(devrt_free(p, 0, s), DEVRT_SUCCESS);
  cudaStreamDestroy(s);
}

TEST(CApiSleep, AWakeWithoutRoomFailsStaysAsleepAndSucceedsOnceThereIsRoom) {
  REQUIRE_GPU();
  started devrt;
  ASSERT_EQ(devrt_set_tag("cuda.model"), DEVRT_SUCCESS);
  void* p = nullptr;
  ASSERT_EQ(devrt_malloc(&p, big, 0, nullptr), DEVRT_SUCCESS) << devrt_last_error();
  ASSERT_EQ(devrt_set_tag(nullptr), DEVRT_SUCCESS);
  devrt::test_kernels::fill_pattern(p, big, 7, nullptr);
  ASSERT_EQ(devrt_sleep(0, "cuda.model", 1), DEVRT_SUCCESS) << devrt_last_error();
  // Take the device's memory but for a little less than the tag needs.
  void* hog = nullptr;
  const std::size_t take = device_free() - big / 2;
  ASSERT_EQ(cudaMalloc(&hog, take), cudaSuccess);
  ASSERT_EQ(devrt_wake(0, "cuda.model"), DEVRT_ERROR_OUT_OF_MEMORY);
  EXPECT_NE(std::string(devrt_last_error()).find("wake of tag 'cuda.model', to map again:"), std::string::npos)
      << devrt_last_error();
  void* q = nullptr;
  ASSERT_EQ(devrt_set_tag("cuda.model"), DEVRT_SUCCESS);
  EXPECT_EQ(devrt_malloc(&q, 1024, 0, nullptr), DEVRT_ERROR_ASLEEP) << "still asleep";
  ASSERT_EQ(devrt_set_tag(nullptr), DEVRT_SUCCESS);
  ASSERT_EQ(cudaFree(hog), cudaSuccess);
  ASSERT_EQ(devrt_wake(0, "cuda.model"), DEVRT_SUCCESS) << devrt_last_error();
  mismatch_counter bad;
  devrt::test_kernels::check_pattern(p, big, 7, bad.d, nullptr);
  EXPECT_EQ(bad.value(), 0u) << "the kept copy survived the failed wake";
  EXPECT_EQ(devrt_free(p, 0, nullptr), DEVRT_SUCCESS);
}

TEST(CApiSleep, ASecondSleepReusesThePinnedCopyBehindBusyStreams) {
  REQUIRE_GPU();
  started devrt;
  cudaStream_t s = nullptr;
  cudaStream_t other = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(devrt_set_tag("cuda.cache"), DEVRT_SUCCESS);
  void* p = nullptr;
  ASSERT_EQ(devrt_malloc(&p, big, 0, s), DEVRT_SUCCESS) << devrt_last_error();
  ASSERT_EQ(devrt_set_tag(nullptr), DEVRT_SUCCESS);
  void* u = nullptr;  // untagged, on another stream: it must not sleep or be disturbed
  ASSERT_EQ(devrt_malloc(&u, big / 4, 0, other), DEVRT_SUCCESS) << devrt_last_error();
  devrt::test_kernels::fill_pattern(p, big, 11, s);
  ASSERT_EQ(devrt_sleep(0, "cuda.cache", 1), DEVRT_SUCCESS) << devrt_last_error();
  ASSERT_EQ(devrt_wake(0, "cuda.cache"), DEVRT_SUCCESS) << devrt_last_error();
  devrt_stats st{};
  ASSERT_EQ(devrt_get_stats(0, &st), DEVRT_SUCCESS);
  const std::uint64_t kept = st.host_cached_bytes;
  EXPECT_GE(kept, big) << "the restored copy's pinned memory is kept";

  devrt::test_kernels::spin_then_fill(u, big / 4, 5, 400'000, other);  // busy, untagged
  devrt::test_kernels::spin_then_fill(p, big, 13, 300'000, s);         // still writing at the sleep
  ASSERT_EQ(devrt_sleep(0, "cuda.cache", 1), DEVRT_SUCCESS) << devrt_last_error();
  ASSERT_EQ(devrt_get_stats(0, &st), DEVRT_SUCCESS);
  EXPECT_EQ(st.host_cached_bytes, 0u) << "the second sleep copied into the kept pinned memory";
  EXPECT_EQ(st.offloaded_bytes, kept);
  ASSERT_EQ(devrt_wake(0, "cuda.cache"), DEVRT_SUCCESS) << devrt_last_error();
  mismatch_counter bad;
  devrt::test_kernels::check_pattern(p, big, 13, bad.d, s);
  EXPECT_EQ(bad.value(), 0u) << "the second sleep kept what the kernel wrote last";
  mismatch_counter bad_u;
  devrt::test_kernels::check_pattern(u, big / 4, 5, bad_u.d, other);
  EXPECT_EQ(bad_u.value(), 0u) << "untagged memory on the other stream was not disturbed";
  std::uint64_t released = 0;
  ASSERT_EQ(devrt_release_host_copies(0, &released), DEVRT_SUCCESS) << devrt_last_error();
  EXPECT_EQ(released, kept);
  EXPECT_EQ(devrt_free(p, 0, s), DEVRT_SUCCESS);
  EXPECT_EQ(devrt_free(u, 0, other), DEVRT_SUCCESS);
  cudaStreamDestroy(s);
  cudaStreamDestroy(other);
}
