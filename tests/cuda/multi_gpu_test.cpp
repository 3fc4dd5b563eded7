// Several GPUs in one process: copies ordered behind busy streams, peer access (its errors on one
// GPU; a kernel on GPU 1 using GPU 0's devrt memory on two), one actor per device under 16 client
// threads, each device's memory back with the driver at shutdown. Tests that need two GPUs skip
// with the reason on one; every test skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "devrt/devices/cuda_storage.hpp"
#include "devrt/runtime/copy.hpp"
#include "devrt/runtime/peer_access.hpp"
#include "devrt/runtime/runtime.hpp"
#include "kernels.hpp"

using namespace devrt;
using namespace devrt::runtime;
using memory::memory_handle;
using memory::stream;

namespace {

#define DEVRT_REQUIRE_GPUS(n)                                                                    \
  do {                                                                                           \
    const int have = devices::cuda_device_count();                                               \
    if (have == 0) GTEST_SKIP() << "CUDA test skipped: " << devices::cuda_unavailable_reason();  \
    if (have < (n)) {                                                                            \
      GTEST_SKIP() << "needs " << (n) << " GPUs, " << have << " visible (CUDA_VISIBLE_DEVICES)"; \
    }                                                                                            \
  } while (false)

runtime_options gpu_options(const char* layout = "auto") {
  runtime_options o;
  o.use_environment = false;
  o.cuda_layout = memory::parse_layout(layout).value();
  return o;
}

bool contains(const std::string& s, const std::string& n) { return s.find(n) != std::string::npos; }

std::string failure_text(auto&& f, errc* code) {
  try {
    f.get();
  } catch (const system_error& e) {
    *code = e.err().code;
    return e.what();
  }
  *code = errc::ok;
  return "";
}

// A counter of mismatching words in memory of `device`.
struct mismatch_counter {
  int device;
  unsigned int* d = nullptr;
  explicit mismatch_counter(int dev) : device(dev) {
    cudaSetDevice(device);
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), sizeof(unsigned int)), cudaSuccess);  // NOLINT
    EXPECT_EQ(cudaMemset(d, 0, sizeof(unsigned int)), cudaSuccess);
  }
  mismatch_counter(const mismatch_counter&) = delete;
  mismatch_counter& operator=(const mismatch_counter&) = delete;
  ~mismatch_counter() {
    cudaSetDevice(device);
    cudaFree(d);
  }
  unsigned int value() const {
    unsigned int v = 0;
    cudaSetDevice(device);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(&v, d, sizeof v, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
};

struct user_stream {
  int device;
  cudaStream_t s = nullptr;
  explicit user_stream(int dev) : device(dev) {
    cudaSetDevice(device);
    EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  }
  user_stream(const user_stream&) = delete;
  user_stream& operator=(const user_stream&) = delete;
  ~user_stream() {
    cudaSetDevice(device);
    cudaStreamDestroy(s);
  }
};

// Fills on the device's own stream, after the work queued there.
void fill_on_device(const compute_client& c, const memory_handle& h, std::uint32_t seed, std::uint64_t spin_us = 0) {
  c.submit({h.binding()}, [seed, spin_us](submit_context& ctx) {
     test_kernels::spin_then_fill(ctx.resources[0].ptr, ctx.resources[0].size, seed, spin_us, ctx.stream);
   }).get();
}

// Checks on the device's own stream; the counter must be memory of the same device.
void check_on_device(const compute_client& c, const memory_handle& h, std::uint32_t seed, mismatch_counter& bad) {
  c.submit({h.binding()}, [seed, &bad](submit_context& ctx) {
     test_kernels::check_pattern(ctx.resources[0].ptr, ctx.resources[0].size, seed, bad.d, ctx.stream);
   }).get();
}

// Whether `peer` may read and write the arena memory at `ptr` of the client's device.
bool peer_maps(const compute_client& c, const void* ptr, int peer) {
  return c
      .async_run<bool>(
          [ptr, peer](actor_core& core) {
            return core.manager().backing_storage().backend<devices::cuda_storage>()->mapped_access(ptr, peer);
          },
          use_future)
      .get();
}

// Free device memory as the driver reports it.
std::size_t free_memory(int device) {
  std::size_t free = 0;
  std::size_t total = 0;
  int current = 0;
  cudaGetDevice(&current);
  cudaSetDevice(device);
  EXPECT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  cudaSetDevice(current);
  return free;
}

}  // namespace

// ---- One GPU ----

TEST(MultiGpu, SameDeviceCopyWaitsForASlowKernelOnTheSource) {
  DEVRT_REQUIRE_GPUS(1);
  for (const char* layout : {"auto", "sub-slices"}) {
    devrt::runtime::runtime rt(gpu_options(layout));
    auto gpu = rt.cuda(0);
    constexpr std::uint64_t n = 8 << 20;
    // On the device's own stream: a kernel that spins, then writes the source.
    auto a = gpu.reserve(n).get();
    auto b = gpu.reserve(n).get();
    fill_on_device(gpu, a, 1234, 3000);
    copy(gpu, a, gpu, b).get();
    mismatch_counter bad(0);
    check_on_device(gpu, b, 1234, bad);
    EXPECT_EQ(bad.value(), 0U) << layout << ": the copy read the source before the kernel wrote it";

    // On two streams of the client's: the source's stream is busy, the copy runs on the
    // destination's, and the source's stream waits for the copy before it overwrites the source.
    user_stream s1(0);
    user_stream s2(0);
    auto x = gpu.reserve(n, stream::native(s1.s)).get();
    auto y = gpu.reserve(n, stream::native(s2.s)).get();
    test_kernels::spin_then_fill(x.ptr(), n, 77, 3000, s1.s);
    copy(gpu, x, gpu, y).get();
    test_kernels::fill_pattern(x.ptr(), n, 78, s1.s);  // after the copy on s1
    mismatch_counter bad2(0);
    test_kernels::check_pattern(y.ptr(), n, 77, bad2.d, s2.s);
    EXPECT_EQ(bad2.value(), 0U) << layout << ": the copy on the destination's stream missed the source's work";
    test_kernels::check_pattern(x.ptr(), n, 78, bad2.d, s1.s);
    EXPECT_EQ(bad2.value(), 0U) << layout;
    ASSERT_EQ(test_kernels::last_error(), nullptr);
    // Dropped while the copies may still run: nothing is reused before they are done.
    x.reset();
    y.reset();
    cudaStreamSynchronize(s1.s);
    cudaStreamSynchronize(s2.s);
    gpu.retire_stream(stream::native(s1.s)).get();
    gpu.retire_stream(stream::native(s2.s)).get();
    EXPECT_EQ(gpu.check_invariants().get(), "");
  }
}

TEST(MultiGpu, CopySizesAndPairsOnOneGpu) {
  DEVRT_REQUIRE_GPUS(1);
  devrt::runtime::runtime rt(gpu_options());
  auto gpu = rt.cuda(0);
  auto a = gpu.reserve(4096).get();
  auto b = gpu.reserve(8192).get();
  errc code{};
  auto what = failure_text(copy(gpu, a, gpu, b), &code);
  EXPECT_EQ(code, errc::invalid_argument);
  EXPECT_TRUE(contains(what, "source 4096 bytes, destination 8192 bytes")) << what;
  auto h = rt.host().reserve(4096).get();
  what = failure_text(copy(rt.host(), h, gpu, a), &code);
  EXPECT_EQ(code, errc::unsupported);
  EXPECT_TRUE(contains(what, "write and read")) << what;
}

TEST(MultiGpu, PeerAccessErrorsOnOneGpu) {
  DEVRT_REQUIRE_GPUS(1);
  const int count = devices::cuda_device_count();
  devrt::runtime::runtime rt(gpu_options());
  auto gpu = rt.cuda(0);
  errc code{};
  auto what = failure_text(set_peer_access(gpu, {0}), &code);
  EXPECT_EQ(code, errc::invalid_argument);
  EXPECT_TRUE(contains(what, "cuda:0 -> cuda:0")) << what;
  what = failure_text(set_peer_access(gpu, {count}), &code);
  EXPECT_EQ(code, errc::invalid_argument);
  EXPECT_TRUE(contains(what, "cuda:0 -> cuda:" + std::to_string(count) + ", " + std::to_string(count) + " device(s)"))
      << what;
  // An empty list is fine, and the device's own access stays.
  set_peer_access(gpu, {}).get();
  auto h = gpu.reserve(1 << 20).get();
  EXPECT_TRUE(peer_maps(gpu, h.ptr(), 0));

  if (count == 1) {
    runtime_options o = gpu_options();
    o.peer_access = {{0, {1}}};
    devrt::runtime::runtime other(o);
    try {
      (void)other.cuda(0);
      FAIL() << "peer cuda:1 accepted on a machine with one GPU";
    } catch (const devrt::exception& e) {
      EXPECT_EQ(e.code(), errc::invalid_argument);
      EXPECT_TRUE(contains(e.what(), "cuda:0 -> cuda:1, 1 device(s)")) << e.what();
    }
    int current = -1;
    cudaGetDevice(&current);
    EXPECT_EQ(current, 0);
  }
}

TEST(MultiGpu, MemoryReturnsToTheDriverAtShutdown) {
  DEVRT_REQUIRE_GPUS(1);
  const int count = std::min(devices::cuda_device_count(), 2);
  std::vector<std::size_t> before;
  for (int d = 0; d < count; ++d) before.push_back(free_memory(d));
  {
    devrt::runtime::runtime rt(gpu_options());
    std::vector<memory_handle> held;
    for (int d = 0; d < count; ++d) {
      for (int k = 0; k < 8; ++k) held.push_back(rt.cuda(d).reserve(128 << 20).get());
    }
    for (int d = 0; d < count; ++d) {
      EXPECT_LT(free_memory(d) + (std::size_t{1} << 30), before[static_cast<std::size_t>(d)] + (64 << 20));
    }
    const auto report = rt.report();
    EXPECT_EQ(static_cast<int>(report.devices.size()), 1 + count);
    std::printf("%s", report.table().c_str());
  }
  for (int d = 0; d < count; ++d) {
    // The driver keeps a little for its own bookkeeping; 64 MiB of slack.
    EXPECT_GE(free_memory(d) + (64 << 20), before[static_cast<std::size_t>(d)]) << "cuda:" << d;
  }
}

// ---- Two GPUs ----

TEST(MultiGpu, SixteenThreadsAcrossTwoGpus) {
  DEVRT_REQUIRE_GPUS(2);
  runtime_options o = gpu_options();
  o.peer_access = {{0, {1}}, {1, {0}}};
  devrt::runtime::runtime rt(o);
  const compute_client gpus[2] = {rt.cuda(0), rt.cuda(1)};
  ASSERT_NE(gpus[0].actor(), gpus[1].actor());
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 100; ++i) {
        const auto& home = gpus[t % 2];
        const auto& away = gpus[(t + 1) % 2];
        const std::size_t n = 4096 * static_cast<std::size_t>(1 + (t * 131 + i * 17) % 256);
        std::vector<std::byte> bytes(n);
        for (std::size_t k = 0; k < n; ++k) bytes[k] = static_cast<std::byte>((k * 31 + t * 7 + i) & 0xff);
        auto x = home.create(n);
        home.write(x.binding(), bytes);
        auto y = away.create(n);
        auto copied = copy(home, x, away, y);
        x.reset();  // dropped while the copy may be queued
        copied.get();
        if (away.read(y.binding()).get() != bytes) bad.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  for (const auto& g : gpus) EXPECT_EQ(g.check_invariants().get(), "");
  std::printf("%s", rt.report().table().c_str());
}

TEST(MultiGpu, KernelOnGpu1UsesGpu0MemoryWithPeerAccess) {
  DEVRT_REQUIRE_GPUS(2);
  int can = 0;
  cudaDeviceCanAccessPeer(&can, 1, 0);
  if (can == 0) GTEST_SKIP() << "cuda:1 cannot reach cuda:0's memory on this machine (no peer path)";
  runtime_options o = gpu_options();
  o.peer_access = {{0, {1}}};
  devrt::runtime::runtime rt(o);
  auto gpu0 = rt.cuda(0);
  constexpr std::uint64_t n = 16 << 20;
  auto x = gpu0.reserve(n).get();
  EXPECT_TRUE(peer_maps(gpu0, x.ptr(), 1));
  fill_on_device(gpu0, x, 5);
  gpu0.synchronize().get();
  {
    user_stream s(1);
    mismatch_counter bad(1);
    test_kernels::check_pattern(x.ptr(), n, 5, bad.d, s.s);
    test_kernels::fill_pattern(x.ptr(), n, 6, s.s);
    EXPECT_EQ(bad.value(), 0U);
    ASSERT_EQ(test_kernels::last_error(), nullptr);
    cudaSetDevice(1);
    ASSERT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
  }
  mismatch_counter bad0(0);
  check_on_device(gpu0, x, 6, bad0);
  EXPECT_EQ(bad0.value(), 0U) << "cuda:1's writes did not reach cuda:0's memory";
  // Memory mapped after the option was applied gets the peer too.
  auto later = gpu0.reserve(256 << 20).get();
  EXPECT_TRUE(peer_maps(gpu0, later.ptr(), 1));
}

TEST(MultiGpu, WithoutPeerAccessTheMappingsSaySoAndCopiesAreRefused) {
  DEVRT_REQUIRE_GPUS(2);
  devrt::runtime::runtime rt(gpu_options());
  auto gpu0 = rt.cuda(0);
  auto gpu1 = rt.cuda(1);
  auto x = gpu0.reserve(8 << 20).get();
  auto y = gpu1.reserve(8 << 20).get();
  // No kernel of cuda:1 touches x (an illegal access would end the context): the access flags say it.
  EXPECT_FALSE(peer_maps(gpu0, x.ptr(), 1));
  errc code{};
  auto what = failure_text(copy(gpu0, x, gpu1, y), &code);
  EXPECT_EQ(code, errc::unsupported);
  EXPECT_TRUE(contains(what, "peer_access = {{0, {1}}}")) << what;

  int can = 0;
  cudaDeviceCanAccessPeer(&can, 1, 0);
  if (can == 0) {
    what = failure_text(set_peer_access(gpu0, {1}), &code);
    EXPECT_EQ(code, errc::unsupported);
    EXPECT_TRUE(contains(what, "cuda:0 -> cuda:1")) << what;
    return;
  }
  // Given later: the mapping there now gets it; taken away again: gone.
  set_peer_access(gpu0, {1}).get();
  EXPECT_TRUE(peer_maps(gpu0, x.ptr(), 1));
  fill_on_device(gpu0, x, 9);
  copy(gpu0, x, gpu1, y).get();
  mismatch_counter bad(1);
  check_on_device(gpu1, y, 9, bad);
  EXPECT_EQ(bad.value(), 0U);
  set_peer_access(gpu0, {}).get();
  EXPECT_FALSE(peer_maps(gpu0, x.ptr(), 1));
}

TEST(MultiGpu, CrossDeviceCopiesBehindBusyStreams) {
  DEVRT_REQUIRE_GPUS(2);
  for (const char* layout : {"auto", "sub-slices"}) {
    runtime_options o = gpu_options(layout);
    int can = 0;
    cudaDeviceCanAccessPeer(&can, 1, 0);
    if (can != 0) o.peer_access = {{0, {1}}, {1, {0}}};
    if (can == 0 && std::string(layout) == "auto") continue;  // arena memory needs the peer path
    devrt::runtime::runtime rt(o);
    auto gpu0 = rt.cuda(0);
    auto gpu1 = rt.cuda(1);
    constexpr std::uint64_t n = 32 << 20;
    auto x = gpu0.reserve(n).get();
    auto y = gpu1.reserve(n).get();
    auto z = gpu0.reserve(n).get();
    fill_on_device(gpu0, x, 21, 5000);  // the source is written after 5 ms of spinning
    copy(gpu0, x, gpu1, y).get();
    fill_on_device(gpu0, x, 22);  // the source's stream waits for the copy before this
    copy(gpu1, y, gpu0, z).get();
    mismatch_counter bad1(1);
    check_on_device(gpu1, y, 21, bad1);
    EXPECT_EQ(bad1.value(), 0U) << layout << ": cuda:0 -> cuda:1 missed the source's kernel";
    mismatch_counter bad0(0);
    check_on_device(gpu0, z, 21, bad0);
    check_on_device(gpu0, x, 22, bad0);
    EXPECT_EQ(bad0.value(), 0U) << layout << ": the round trip or the source's later write went wrong";
    EXPECT_EQ(gpu0.check_invariants().get(), "");
    EXPECT_EQ(gpu1.check_invariants().get(), "");
  }
}
