// Tests of the CUDA device: storage contract, out-of-memory recovery, kernels through submit,
// graph capture, reconfiguration, many threads, several GPUs. Every test skips with the reason
// when no GPU is usable (CI has the toolkit but no GPU).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "devrt/devices/cuda_storage.hpp"
#include "devrt/memory/memory_manager.hpp"
#include "devrt/runtime/runtime.hpp"
#include "kernels.hpp"
#include "require_gpu.hpp"

using namespace devrt;
using namespace devrt::runtime;
using memory::memory_handle;

namespace {

std::vector<std::byte> bytes_of(std::uint64_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<std::byte>(rng() & 0xff);
  return v;
}

runtime_options cuda_only() {
  runtime_options o;
  o.use_environment = false;
  return o;
}

}  // namespace

// ---- Storage contract on CUDA ----

TEST(CudaStorage, PropertiesFromTheDriver) {
  DEVRT_REQUIRE_GPU();
  devices::cuda_storage s(0);
  const auto p = s.properties();
  EXPECT_GT(p.capacity, 0u);
  EXPECT_EQ(p.alignment & (p.alignment - 1), 0u);
  EXPECT_GE(p.alignment, 256u);
  EXPECT_EQ(p.max_page_size, p.capacity / 4 / p.alignment * p.alignment);
  EXPECT_NE(s.native_stream(), nullptr);
}

TEST(CudaStorage, AllocWriteReadFlush) {
  DEVRT_REQUIRE_GPU();
  devices::cuda_storage s(0);
  auto a = s.alloc(1 << 20);
  auto b = s.alloc(4096);
  ASSERT_TRUE(a) << a.err().message();
  ASSERT_TRUE(b);
  EXPECT_NE(a->id, b->id);
  const auto data = bytes_of(32, 1);
  const auto view = a->offset_start(24).offset_end(a->size - 24 - 32);
  ASSERT_TRUE(s.write(view, data.data()));
  std::vector<std::byte> back(32);
  ASSERT_TRUE(s.read(view, back.data()));
  EXPECT_EQ(std::memcmp(back.data(), data.data(), 32), 0);
  auto r = s.get(view);
  ASSERT_TRUE(r);
  EXPECT_EQ(static_cast<std::byte*>(r->ptr) - static_cast<std::byte*>(s.get(*a)->ptr), 24);
  EXPECT_EQ(s.get(memory::storage_handle{a->id, 0, a->size + 1}).code(), errc::invalid_argument);
  s.dealloc(a->id);
  EXPECT_EQ(s.pending_deallocations(), 1u);
  EXPECT_TRUE(s.get(*a));  // still there until the flush
  ASSERT_TRUE(s.flush());
  EXPECT_EQ(s.get(*a).code(), errc::not_found);
  EXPECT_EQ(s.driver_frees(), 1u);
}

TEST(CudaStorage, RefusedAllocationCarriesTheCudaErrorName) {
  DEVRT_REQUIRE_GPU();
  devices::cuda_storage s(0);
  auto r = s.alloc(s.properties().capacity * 2);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.code(), errc::out_of_memory);
  EXPECT_NE(r.err().message().find("cudaErrorMemoryAllocation"), std::string::npos) << r.err().message();
  EXPECT_TRUE(s.alloc(4096));  // the storage still works
}

TEST(CudaStorage, AddressRangesMapAndUnmapInStreamOrder) {
  DEVRT_REQUIRE_GPU();
  devices::cuda_storage s(0);
  const std::uint64_t g = s.properties().map_granularity;
  ASSERT_GT(g, 0u) << "this GPU's driver offers no virtual memory management";
  auto range = s.reserve_range(64 * g, 2 * g);
  ASSERT_TRUE(range) << range.err().message();
  EXPECT_EQ(s.map(range->id, g, 2 * g).code(), errc::invalid_argument);  // not whole units
  // Two mappings, each one physical allocation.
  ASSERT_TRUE(s.map(range->id, 0, 2 * g));
  ASSERT_TRUE(s.map(range->id, 2 * g, 2 * g));
  EXPECT_EQ(s.mapped_bytes(), 4 * g);
  EXPECT_EQ(s.map(range->id, 2 * g, 2 * g).code(), errc::invalid_argument);  // mapped already
  const auto data = bytes_of(3 * g, 7);
  const memory::storage_handle view{range->id, 512, 3 * g};  // spans both mappings
  ASSERT_TRUE(s.write(view, data.data()));
  std::vector<std::byte> back(3 * g);
  ASSERT_TRUE(s.read(view, back.data()));
  EXPECT_EQ(std::memcmp(back.data(), data.data(), back.size()), 0);
  // Only a whole mapping is unmapped; a part of one is ignored.
  s.unmap(range->id, 0, 4 * g);
  EXPECT_EQ(s.pending_deallocations(), 0u);
  // An unmap waits for the stream: the memory stays until a flush after the queued work.
  s.unmap(range->id, 2 * g, 2 * g);
  EXPECT_EQ(s.mapped_bytes(), 4 * g);
  EXPECT_EQ(s.pending_deallocations(), 1u);
  ASSERT_TRUE(s.synchronize());
  ASSERT_TRUE(s.flush());
  ASSERT_TRUE(s.flush());  // completes the batch whose event has passed
  EXPECT_EQ(s.mapped_bytes(), 2 * g);
  // Mapping the same again before the unmap happened keeps the memory and its data.
  s.unmap(range->id, 0, 2 * g);
  ASSERT_TRUE(s.map(range->id, 0, 2 * g));
  EXPECT_EQ(s.mapped_bytes(), 2 * g);
  ASSERT_TRUE(s.read(memory::storage_handle{range->id, 512, 1024}, back.data()));
  EXPECT_EQ(std::memcmp(back.data(), data.data(), 1024), 0) << "memory whose unmap was cancelled lost its data";
  // Mapping other bounds over addresses whose unmap is pending waits for the unmap, then maps.
  s.unmap(range->id, 0, 2 * g);
  ASSERT_TRUE(s.map(range->id, 0, 4 * g));
  EXPECT_EQ(s.mapped_bytes(), 4 * g);
  ASSERT_TRUE(s.write(view, data.data()));
  ASSERT_TRUE(s.read(view, back.data()));
  EXPECT_EQ(std::memcmp(back.data(), data.data(), back.size()), 0);
  s.release_range(range->id);
  EXPECT_EQ(s.mapped_bytes(), 4 * g) << "a release takes effect at the flush";
  ASSERT_TRUE(s.synchronize());
  ASSERT_TRUE(s.flush());
  EXPECT_EQ(s.mapped_bytes(), 0u);
  EXPECT_EQ(s.get(*range).code(), errc::not_found);
}

// ---- Manager on CUDA: filling the GPU ----

TEST(CudaManager, FillTheGpuThenRecover) {
  DEVRT_REQUIRE_GPU();
  memory::memory_manager m(
      memory::storage::make<devices::cuda_storage>(0),
      memory::manager_options{
          "cuda", memory::memory_layout(std::vector<memory::pool_config>{memory::exclusive_pool_config{8ULL << 30}})});
  std::vector<memory_handle> held;
  result<memory_handle> last = error::make(errc::ok);
  for (int i = 0; i < 64; ++i) {
    last = m.reserve(4ULL << 30);
    if (!last) break;
    held.push_back(*last);
  }
  ASSERT_FALSE(last) << "the GPU never filled";
  EXPECT_EQ(last.code(), errc::out_of_memory);
  EXPECT_NE(last.err().message().find("cudaErrorMemoryAllocation"), std::string::npos);
  EXPECT_EQ(m.check_invariants(), "");
  EXPECT_GE(m.statistics().out_of_memory, 1u);
  held.pop_back();
  held.pop_back();
  ASSERT_TRUE(m.reclaim());
  auto again = m.reserve(4ULL << 30);
  EXPECT_TRUE(again) << again.err().message();
  EXPECT_EQ(m.check_invariants(), "");
}

TEST(CudaManager, ArenaFillsTheGpuThenRecovers) {
  DEVRT_REQUIRE_GPU();
  memory::memory_manager m(memory::storage::make<devices::cuda_storage>(0),
                           memory::manager_options{"cuda", memory::preset::arena});
  ASSERT_EQ(m.layout().front().kind, memory::pool_kind::arena);
  std::vector<memory_handle> held;
  result<memory_handle> last = error::make(errc::ok);
  for (int i = 0; i < 64; ++i) {
    last = m.reserve(4ULL << 30);
    if (!last) break;
    held.push_back(*last);
  }
  ASSERT_FALSE(last) << "the GPU never filled";
  EXPECT_EQ(last.code(), errc::out_of_memory);
  EXPECT_NE(last.err().message().find("CUDA_ERROR_OUT_OF_MEMORY"), std::string::npos) << last.err().message();
  EXPECT_EQ(m.check_invariants(), "");
  held.pop_back();
  held.pop_back();
  ASSERT_TRUE(m.reclaim());
  auto again = m.reserve(4ULL << 30);
  EXPECT_TRUE(again) << again.err().message();
  EXPECT_EQ(m.check_invariants(), "");
  // The memory held follows the live bytes: dropping everything gives it back.
  held.clear();
  again = error::make(errc::ok);
  ASSERT_TRUE(m.reclaim());
  EXPECT_EQ(m.statistics().bytes_reserved, 0u);
}

// ---- Through the actor ----

TEST(CudaRuntime, DiscoversEveryGpu) {
  DEVRT_REQUIRE_GPU();
  runtime::runtime rt(cuda_only());
  EXPECT_EQ(rt.count(device_kind::cuda), devices::cuda_device_count());
  EXPECT_EQ(rt.cuda().device().kind, device_kind::cuda);
}

TEST(CudaRuntime, OutOfMemoryReclaimsOnceAndRetries) {
  DEVRT_REQUIRE_GPU();
  auto opts = cuda_only();
  opts.cuda_layout =
      memory::memory_layout(std::vector<memory::pool_config>{memory::exclusive_pool_config{16ULL << 30}});
  runtime::runtime rt(opts);
  auto c = rt.cuda();
  std::vector<memory_handle> held;
  for (int i = 0; i < 32; ++i) {
    try {
      held.push_back(c.reserve(8ULL << 30).get());
    } catch (const boost::system::system_error& e) {
      EXPECT_EQ(e.code(), errc::out_of_memory) << e.what();
      break;
    }
  }
  ASSERT_GE(held.size(), 2u);
  // Free pages stay cached in the pool; the next reserve that does not fit the driver's free
  // memory succeeds only through the reclaim.
  held.resize(held.size() - 2);
  auto h = c.reserve(12ULL << 30).get();
  EXPECT_TRUE(h.can_mut());
  EXPECT_GE(c.statistics().get().reclaims, 1u);
  EXPECT_EQ(c.check_invariants().get(), "");
}

TEST(CudaRuntime, KernelsThroughSubmitSeeBoundMemory) {
  DEVRT_REQUIRE_GPU();
  runtime::runtime rt(cuda_only());
  auto c = rt.cuda();
  auto flag = c.create(4);
  c.write(flag.binding(), std::vector<std::byte>(4));
  for (std::uint32_t i = 0; i < 200; ++i) {
    const std::uint64_t size = 4096ULL * (1 + i % 64);
    auto h = c.create(size);
    c.submit({h.binding()}, [i](submit_context& s) {
      test_kernels::fill_pattern(s.resources[0].ptr, s.resources[0].size, i, s.stream);
    });
    c.submit({h.binding(), flag.binding()}, [i](submit_context& s) {
      test_kernels::check_pattern(s.resources[0].ptr, s.resources[0].size, i,
                                  static_cast<unsigned int*>(s.resources[1].ptr), s.stream);
    });
  }
  auto out = c.read(flag.binding()).get();
  unsigned int bad = 0;
  std::memcpy(&bad, out.data(), 4);
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(test_kernels::last_error(), nullptr);
}

// 16 client threads on one GPU: each allocation is filled by a kernel and checked by another
// before it is released; overlapping live slices would corrupt some pattern.
TEST(CudaRuntime, SixteenThreadsWithPatterns) {
  DEVRT_REQUIRE_GPU();
  runtime::runtime rt(cuda_only());
  auto c = rt.cuda();
  auto flag = c.create(4);
  c.write(flag.binding(), std::vector<std::byte>(4));
  constexpr int threads = 16;
  constexpr int ops = 3000;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<std::uint64_t>(t));
      std::vector<std::pair<memory_handle, std::uint32_t>> live(16);
      for (int op = 0; op < ops; ++op) {
        auto& slot = live[static_cast<std::size_t>(op) % live.size()];
        if (!slot.first.empty()) {
          const std::uint32_t seed = slot.second;
          c.submit({slot.first.binding(), flag.binding()}, [seed](submit_context& s) {
            test_kernels::check_pattern(s.resources[0].ptr, s.resources[0].size, seed,
                                        static_cast<unsigned int*>(s.resources[1].ptr), s.stream);
          });
        }
        const std::uint64_t size = 512ULL << (rng() % 12);  // 512 B .. 1 MiB
        const auto seed = static_cast<std::uint32_t>(t * ops + op);
        slot = {c.create(size), seed};
        c.submit({slot.first.binding()}, [seed](submit_context& s) {
          test_kernels::fill_pattern(s.resources[0].ptr, s.resources[0].size, seed, s.stream);
        });
      }
    });
  }
  for (auto& th : pool) th.join();
  auto out = c.read(flag.binding()).get();
  unsigned int bad = 0;
  std::memcpy(&bad, out.data(), 4);
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(c.check_invariants().get(), "");
}

// ---- Graph capture ----

TEST(CudaGraph, CaptureReplaysCorrectlyAndNeverAllocatesFromTheDriver) {
  DEVRT_REQUIRE_GPU();
  runtime::runtime rt(cuda_only());
  auto c = rt.cuda();
  static constexpr std::uint64_t n = 1 << 20;
  auto x = c.create(n * 4);
  auto y = c.create(n * 4);
  std::vector<float> xs(n, 2.0F);
  std::vector<float> ys(n, 1.0F);
  c.write(x.binding(), std::vector<std::byte>(reinterpret_cast<std::byte*>(xs.data()),
                                              reinterpret_cast<std::byte*>(xs.data()) + n * 4));
  c.write(y.binding(), std::vector<std::byte>(reinterpret_cast<std::byte*>(ys.data()),
                                              reinterpret_cast<std::byte*>(ys.data()) + n * 4));
  // The pipeline: tmp = x*x (a scratch buffer from the persistent pool), y += 0.5 * tmp.
  auto pipeline = [&] {
    memory_handle tmp;
    {
      auto scope = c.persistent();
      tmp = c.create(n * 4);
    }
    c.submit({x.binding(), tmp.binding(), y.binding()}, [](submit_context& s) {
      test_kernels::square(static_cast<const float*>(s.resources[0].ptr), static_cast<float*>(s.resources[1].ptr), n,
                           s.stream);
      test_kernels::saxpy(0.5F, static_cast<const float*>(s.resources[1].ptr), static_cast<float*>(s.resources[2].ptr),
                          n, s.stream);
    });
  };
  pipeline();  // warm-up: the persistent pool now holds the scratch buffer
  c.synchronize().get();
  const auto before = c.statistics().get();
  c.capture_begin().get();
  pipeline();
  auto graph = c.capture_end().get();
  const auto after = c.statistics().get();
  EXPECT_TRUE(graph.recorded());
  EXPECT_EQ(graph.pins().size(), 1u);
  EXPECT_EQ(after.driver_allocs, before.driver_allocs) << "the capture called the driver's allocator";
  constexpr int replays = 50;
  for (int i = 0; i < replays; ++i) c.replay(graph).get();
  c.synchronize().get();
  auto out = c.read(y.binding()).get();
  std::vector<float> result(n);
  std::memcpy(result.data(), out.data(), n * 4);
  // 1 + warm-up 2 + 50 replays of 2 (0.5 * 2 * 2 each).
  const float expect = 1.0F + 2.0F * (1 + replays);
  for (std::uint64_t i = 0; i < n; i += 4099) ASSERT_FLOAT_EQ(result[i], expect) << "at " << i;
  // Dropping the graph releases its pins once the device has passed its replays (from an event:
  // the device thread does not wait for them).
  const auto live = c.memory_usage().get().number_allocs;
  graph = device_graph();
  for (int i = 0; i < 2000 && c.memory_usage().get().number_allocs != live - 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(c.memory_usage().get().number_allocs, live - 1);
}

TEST(CudaGraph, AllocationInsideCaptureWithoutWarmupIsRefused) {
  DEVRT_REQUIRE_GPU();
  runtime::runtime rt(cuda_only());
  auto c = rt.cuda();
  c.capture_begin().get();
  try {
    (void)c.reserve(3ULL << 20).get();
    FAIL() << "a driver allocation inside a capture was allowed";
  } catch (const boost::system::system_error& e) {
    EXPECT_EQ(e.code(), errc::capture_active) << e.what();
  }
  auto graph = c.capture_end().get();
  EXPECT_TRUE(graph.pins().empty());
  EXPECT_EQ(c.check_invariants().get(), "");
}

// ---- Reconfiguration between two model loads ----

TEST(CudaRuntime, ReconfigureBetweenModels) {
  DEVRT_REQUIRE_GPU();
  runtime::runtime rt(cuda_only());
  auto c = rt.cuda();
  std::vector<memory_handle> weights_a;
  {
    auto scope = c.persistent();
    for (int i = 0; i < 4; ++i) weights_a.push_back(c.create(64ULL << 20));
  }
  std::vector<memory_handle> activations;
  for (int i = 0; i < 32; ++i) activations.push_back(c.create(1ULL << 20));
  const auto layout_b = memory::parse_layout("exclusive:max=0;sliced:page=64MiB,slice=4MiB;sliced:page=1GiB").value();
  auto kept = c.configure(layout_b).get();
  EXPECT_FALSE(kept.applied);
  EXPECT_EQ(kept.live_bytes, 32ULL << 20);
  activations.clear();
  weights_a.clear();
  auto applied = c.configure(layout_b).get();
  EXPECT_TRUE(applied.applied);
  std::vector<memory_handle> weights_b;
  {
    auto scope = c.persistent();
    for (int i = 0; i < 4; ++i) weights_b.push_back(c.create(96ULL << 20));
  }
  auto x = c.create(2ULL << 20);
  auto data = bytes_of(2ULL << 20, 7);
  c.write(x.binding(), data);
  EXPECT_EQ(c.read(x.binding()).get(), data);
  EXPECT_EQ(c.check_invariants().get(), "");
}

// ---- Several GPUs ----

TEST(CudaRuntime, TwoDevicesEachWithItsActor) {
  DEVRT_REQUIRE_GPU();
  if (devices::cuda_device_count() < 2) GTEST_SKIP() << "needs two GPUs; this machine has one";
  runtime::runtime rt(cuda_only());
  auto a = rt.cuda(0);
  auto b = rt.cuda(1);
  EXPECT_NE(a.actor(), b.actor());
  auto data = bytes_of(8ULL << 20, 3);
  auto ha = a.create(data.size());
  auto hb = b.create(data.size());
  a.write(ha.binding(), data);
  auto from_a = a.read(ha.binding()).get();
  b.write(hb.binding(), from_a);
  EXPECT_EQ(b.read(hb.binding()).get(), data);
  // A handle of one device does not resolve on the other.
  try {
    (void)b.get_resource(ha.binding()).get();
    FAIL() << "a handle of cuda:0 resolved on cuda:1";
  } catch (const boost::system::system_error& e) {
    EXPECT_EQ(e.code(), errc::not_found);
  }
  EXPECT_EQ(a.check_invariants().get(), "");
  EXPECT_EQ(b.check_invariants().get(), "");
}
