// Stream order on a real GPU, with streams kept busy: kernels still queued when their memory is
// dropped, slow kernels, many streams, the legacy and per-thread default streams, unmaps behind
// busy streams, a device thread that never waits for the GPU. Every test skips with the reason
// when no GPU is usable. Run them under compute-sanitizer too (memcheck must stay clean).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "devrt/devices/cuda_storage.hpp"
#include "devrt/memory/memory_manager.hpp"
#include "devrt/runtime/runtime.hpp"
#include "kernels.hpp"
#include "mismatch_counter.hpp"
#include "require_gpu.hpp"

using namespace devrt;
using namespace devrt::runtime;
using memory::memory_handle;
using memory::stream;

namespace {

runtime_options gpu_options(const char* layout = "auto") {
  runtime_options o;
  o.use_environment = false;
  o.cuda_layout = memory::parse_layout(layout).value();
  return o;
}

// A non-blocking stream of the test's own, destroyed at the end of the scope.
struct user_stream {
  cudaStream_t s = nullptr;
  user_stream() { EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess); }
  user_stream(const user_stream&) = delete;
  user_stream& operator=(const user_stream&) = delete;
  ~user_stream() { cudaStreamDestroy(s); }
};

// Holds a stream at a host function until `open()`: work queued behind it waits however the
// kernels are timed (under compute-sanitizer a spinning kernel may be done before its launch
// returns). `reached()` says the stream got to the gate, so everything queued before it has run.
class stream_gate {
 public:
  explicit stream_gate(cudaStream_t s) : state_(std::make_shared<state>()) {
    // The host function holds its own reference: the gate may go first (it opens on the way).
    auto* ref = new std::shared_ptr<state>(state_);
    EXPECT_EQ(cudaLaunchHostFunc(s, &stream_gate::hold, ref), cudaSuccess);
  }
  stream_gate(const stream_gate&) = delete;
  stream_gate& operator=(const stream_gate&) = delete;
  ~stream_gate() { open(); }
  void open() { state_->open.store(true); }
  [[nodiscard]] bool reached() const { return state_->reached.load(); }
  /// Waits (up to 10 s) until the stream is at the gate.
  void wait_reached() const {
    for (int i = 0; i < 100'000 && !reached(); ++i) std::this_thread::sleep_for(std::chrono::microseconds(100));
    EXPECT_TRUE(reached()) << "the stream never reached the gate";
  }

 private:
  struct state {
    std::atomic<bool> open{false};
    std::atomic<bool> reached{false};
  };
  static void CUDART_CB hold(void* p) {
    const std::shared_ptr<state> st = std::move(*static_cast<std::shared_ptr<state>*>(p));
    delete static_cast<std::shared_ptr<state>*>(p);
    st->reached.store(true);
    while (!st->open.load()) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  std::shared_ptr<state> state_;
};

enum class which_stream { own, legacy, per_thread };

// Each client thread: per request, reserves a few allocations for its stream, fills each with a
// pattern of its own, lets some kernels spin for hundreds of microseconds, checks the pattern
// after the spin (so the check runs long after the handle was dropped), and drops the handles
// while all of that is still queued. Memory handed to another stream too early is overwritten by
// that stream's pattern, and the check counts it.
void requests_on_streams(which_stream kind, int threads, int requests) {
  devrt::runtime::runtime rt(gpu_options());
  auto gpu = rt.cuda(0);
  mismatch_counter bad;
  std::atomic<int> failures{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      cudaSetDevice(0);
      // Only the own-stream variant makes a stream: under compute-sanitizer, cudaStreamDestroy on
      // client threads beside the device thread's event records on the legacy stream deadlocks
      // inside the driver and the sanitizer (RELIABILITY.md, "GPU run").
      std::optional<user_stream> own;
      if (kind == which_stream::own) own.emplace();
      void* native = kind == which_stream::own      ? static_cast<void*>(own->s)
                     : kind == which_stream::legacy ? nullptr
                                                    : reinterpret_cast<void*>(2);  // NOLINT: cudaStreamPerThread
      const stream s = stream::native(native);
      std::mt19937 rng(static_cast<unsigned>(t) * 7919U + 1U);
      for (int r = 0; r < requests; ++r) {
        std::vector<memory_handle> live;
        for (int k = 0; k < 4; ++k) {
          const std::uint64_t bytes = 4096ULL * (1 + rng() % 1024);  // 4 KiB .. 4 MiB
          memory_handle h = gpu.reserve(bytes, s).get();
          if (h.ptr() == nullptr || h.size() != bytes) {
            failures.fetch_add(1);
            continue;
          }
          const std::uint32_t seed = static_cast<std::uint32_t>(t * 1000003 + r * 17 + k);
          test_kernels::fill_pattern(h.ptr(), bytes, seed, native);
          const std::uint64_t spin_us = (rng() % 4 == 0) ? 200 + rng() % 400 : 0;
          test_kernels::spin_then_check(h.ptr(), bytes, seed, spin_us, bad.d, native);
          live.push_back(std::move(h));
        }
        live.clear();  // dropped while the kernels are still queued
        if (test_kernels::last_error() != nullptr) failures.fetch_add(1);
      }
      // The thread's own stream is destroyed with its kernels still queued, neither synchronized
      // nor retired: its frees were fenced when they happened.
    });
  }
  for (auto& th : pool) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(bad.value(), 0u) << "memory was handed to another stream while a kernel still used it";
  auto stats = gpu.statistics().get();
  EXPECT_EQ(gpu.check_invariants().get(), "");
  std::printf("[ streams  ] %d threads x %d requests: %llu fences, %llu waits under pressure, %llu streams\n", threads,
              requests, static_cast<unsigned long long>(stats.fences),
              static_cast<unsigned long long>(stats.stream_waits), static_cast<unsigned long long>(stats.streams));
}

}  // namespace

TEST(CudaStreams, SixteenThreadsEachWithItsOwnStream) {
  DEVRT_REQUIRE_GPU();
  requests_on_streams(which_stream::own, 16, 200);
}

TEST(CudaStreams, SixteenThreadsOnTheLegacyDefaultStream) {
  DEVRT_REQUIRE_GPU();
  requests_on_streams(which_stream::legacy, 16, 100);
}

TEST(CudaStreams, SixteenThreadsOnTheirPerThreadDefaultStreams) {
  DEVRT_REQUIRE_GPU();
  requests_on_streams(which_stream::per_thread, 16, 100);
}

// ---- The review's GPU findings (reproducers g1, g4 of code-review-0de9911) ----

namespace {

constexpr std::uint64_t big = 64ULL << 20;  // 16 M words

bool same_memory(const memory_handle& a, void* p) { return a.ptr() == p; }

}  // namespace

// Finding B1: an explicit cleanup (empty_cache) with a kernel still running on a side stream took
// its unfenced frees for done, and the next allocation on another stream got the same memory
// while the kernel still wrote it: every word wrong. Now the cleanup waits for nothing and hands
// out nothing early.
TEST(CudaStreams, AnEmptyCacheWithASideStreamStillRunningHandsOutNothingEarly) {
  DEVRT_REQUIRE_GPU();
  devrt::runtime::runtime rt(gpu_options());
  auto gpu = rt.cuda(0);
  user_stream a;
  user_stream b;
  memory_handle anchor = gpu.reserve(4096, stream::native(b.s)).get();  // B in use first
  memory_handle x = gpu.reserve(big, stream::native(a.s)).get();
  void* const xp = x.ptr();
  test_kernels::spin_then_fill(xp, big, 1, 1'000'000, a.s);  // writes x about a second from now
  x.reset();
  const auto t0 = std::chrono::steady_clock::now();
  gpu.cleanup().get();  // torch.cuda.empty_cache(), devrt_empty_cache
  const double cleanup_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  memory_handle y = gpu.reserve(big, stream::native(b.s)).get();
  test_kernels::fill_pattern(y.ptr(), big, 2, b.s);
  ASSERT_EQ(cudaStreamSynchronize(b.s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(a.s), cudaSuccess);
  mismatch_counter bad;
  test_kernels::check_pattern(y.ptr(), big, 2, bad.d, b.s);
  const unsigned wrong = bad.value();
  std::printf("[ g1 case 1] empty_cache %.2f ms; y == x: %s; words of y that are not 2: %u\n", cleanup_ms,
              same_memory(y, xp) ? "yes" : "no", wrong);
  EXPECT_EQ(wrong, 0u) << "stream B got memory that stream A's kernel still wrote";
  EXPECT_LT(cleanup_ms, 500.0) << "the cleanup waited for the side stream";
  EXPECT_EQ(gpu.statistics().get().stream_waits, 0u);
}

// Memory every stream has passed goes back at once, even while another stream still runs: every
// free is fenced on its stream, so no queued work can reach memory that came back for all streams.
// An empty_cache then returns it without an event behind the busy stream, and the device holds it
// no longer.
TEST(CudaStreams, AnEmptyCacheReturnsMemoryEveryStreamPassedWhileAnotherStreamRuns) {
  DEVRT_REQUIRE_GPU();
  devrt::runtime::runtime rt(gpu_options("arena:grow=0"));  // no mapping ahead: X has mappings of its own
  auto gpu = rt.cuda(0);
  user_stream a;
  user_stream b;
  memory_handle x = gpu.reserve(big, stream::native(a.s)).get();
  memory_handle anchor = gpu.reserve(4096, stream::native(b.s)).get();
  test_kernels::fill_pattern(x.ptr(), big, 1, a.s);
  x.reset();
  ASSERT_EQ(cudaStreamSynchronize(a.s), cudaSuccess);  // A's work, and the fence of X's free, have passed
  test_kernels::spin_then_fill(anchor.ptr(), 4096, 3, 300'000, b.s);  // B runs for 300 ms
  const memory::memory_statistics before = gpu.statistics().get();
  gpu.cleanup().get();  // torch.cuda.empty_cache(), devrt_empty_cache
  const bool still_busy = cudaStreamQuery(b.s) == cudaErrorNotReady;
  const memory::memory_statistics after = gpu.statistics().get();
  ASSERT_GT(after.unmaps, before.unmaps) << "the cleanup must unmap X's memory";
  EXPECT_LE(after.bytes_reserved + big, before.bytes_reserved);
  if (still_busy) {
    EXPECT_EQ(after.bytes_returning, 0u) << "memory no queued work can reach waited behind B's kernel";
  } else {
    std::printf("[ note ] B finished before the cleanup returned: the check of memory on its way back is moot\n");
  }
  ASSERT_EQ(cudaStreamSynchronize(b.s), cudaSuccess);
  EXPECT_EQ(gpu.statistics().get().stream_waits, 0u);
  gpu.retire_stream(stream::native(a.s)).get();
  gpu.retire_stream(stream::native(b.s)).get();
}

// Finding B3: a stream destroyed with work queued, and a new stream that gets the same handle from
// the driver. The new stream got the old one's memory at once, and the old kernel's late write
// overwrote every word. Now the handle names a new stream, which waits for nothing and gets other
// memory.
TEST(CudaStreams, AStreamDestroyedWithWorkQueuedNeverLendsItsMemoryToTheNextStream) {
  DEVRT_REQUIRE_GPU();
  devrt::runtime::runtime rt(gpu_options());
  auto gpu = rt.cuda(0);
  user_stream b;
  memory_handle anchor = gpu.reserve(4096, stream::native(b.s)).get();
  cudaStream_t c = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking), cudaSuccess);
  memory_handle z = gpu.reserve(big, stream::native(c)).get();
  void* const zp = z.ptr();
  test_kernels::spin_then_fill(zp, big, 3, 1'000'000, c);
  z.reset();
  ASSERT_EQ(cudaStreamDestroy(c), cudaSuccess);  // returns at once; the kernel still runs
  cudaStream_t d = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&d, cudaStreamNonBlocking), cudaSuccess);
  const auto t0 = std::chrono::steady_clock::now();
  memory_handle w = gpu.reserve(big, stream::native(d)).get();
  const double reserve_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  test_kernels::fill_pattern(w.ptr(), big, 4, d);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  mismatch_counter bad;
  test_kernels::check_pattern(w.ptr(), big, 4, bad.d, d);
  const unsigned wrong = bad.value();
  std::printf(
      "[ g1 case 2] new stream reuses the destroyed one's handle: %s; w == z: %s; reserve %.2f ms; "
      "words of w that are not 4: %u\n",
      d == c ? "yes" : "no", same_memory(w, zp) ? "yes" : "no", reserve_ms, wrong);
  EXPECT_EQ(wrong, 0u) << "the destroyed stream's kernel wrote the new stream's memory";
  EXPECT_LT(reserve_ms, 500.0) << "the reserve waited for the destroyed stream";
  EXPECT_EQ(gpu.statistics().get().stream_waits, 0u);
  w.reset();
  cudaStreamDestroy(d);
}

// Finding B5: a retired stream whose handle comes back for a new stream made the device thread
// wait for the old stream's kernel; every client of the device waited (859 ms). Now the new stream
// is a registration of its own and nothing waits: reserves on an unrelated stream keep a p99
// under a millisecond while the old kernel spins for a second.
TEST(CudaStreams, ARecycledRetiredStreamNeverStallsTheDevice) {
  DEVRT_REQUIRE_GPU();
  devrt::runtime::runtime rt(gpu_options());
  auto gpu = rt.cuda(0);
  user_stream b;
  cudaStream_t a = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
  memory_handle x = gpu.reserve(big, stream::native(a)).get();
  test_kernels::spin_then_fill(x.ptr(), big, 5, 1'000'000, a);
  x.reset();
  gpu.retire_stream(stream::native(a)).get();
  ASSERT_EQ(cudaStreamDestroy(a), cudaSuccess);
  cudaStream_t again = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&again, cudaStreamNonBlocking), cudaSuccess);
  std::atomic<bool> stop{false};
  std::vector<double> lat;
  std::thread other([&] {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1200);
    while (std::chrono::steady_clock::now() < until) {
      const auto t0 = std::chrono::steady_clock::now();
      memory_handle h = gpu.reserve(4096, stream::native(b.s)).get();
      lat.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    stop = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const auto t0 = std::chrono::steady_clock::now();
  memory_handle y = gpu.reserve(4096, stream::native(again)).get();
  const double first_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  other.join();
  std::sort(lat.begin(), lat.end());
  const double p99 = lat.empty() ? 0.0 : lat[lat.size() * 99 / 100];
  const double worst = lat.empty() ? 0.0 : lat.back();
  std::printf(
      "[ g4       ] handle reused: %s; first reserve on the new stream %.1f us; %zu reserves on stream B "
      "meanwhile: p99 %.1f us, worst %.1f us; stream_waits %llu\n",
      again == a ? "yes" : "no", first_us, lat.size(), p99, worst,
      static_cast<unsigned long long>(gpu.statistics().get().stream_waits));
  EXPECT_LT(p99, 1000.0) << "reserves on an unrelated stream waited for the old stream's kernel";
  EXPECT_LT(first_us, 1000.0);
  EXPECT_EQ(gpu.statistics().get().stream_waits, 0u);
  y.reset();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaStreamDestroy(again);
}

// Finding B7: a read or a write on the device's stream during a capture was recorded into the graph
// with its staging buffer given back to the pool. Now both are refused before anything is
// enqueued, and the graph holds only the capture's own work.
TEST(CudaGraph, ReadsAndWritesInsideACaptureAreRefusedAndTheGraphStaysIntact) {
  DEVRT_REQUIRE_GPU();
  devrt::runtime::runtime rt(gpu_options());
  auto gpu = rt.cuda(0);
  constexpr std::uint64_t bytes = 1 << 20;
  memory_handle h = gpu.create(bytes);
  (void)gpu
      .submit({h.binding()},
              [](submit_context& c) { test_kernels::fill_pattern(c.resources[0].ptr, bytes, 4, c.stream); })
      .get();
  const auto staging_before = gpu.statistics().get();
  gpu.capture_begin().get();
  (void)gpu
      .submit({h.binding()},
              [](submit_context& c) { test_kernels::fill_pattern(c.resources[0].ptr, bytes, 5, c.stream); })
      .get();
  auto refused = [](auto&& f) {
    try {
      (void)f.get();
    } catch (const boost::system::system_error& e) {
      return e.code() == errc::capture_active;
    }
    return false;
  };
  EXPECT_TRUE(refused(gpu.write(h.binding(), std::vector<std::byte>(bytes, std::byte{9}))));
  EXPECT_TRUE(refused(gpu.read(h.binding())));
  EXPECT_TRUE(refused(gpu.synchronize()));
  auto graph = gpu.capture_end().get();
  ASSERT_TRUE(graph.recorded());
  // Overwrite the memory, then replay: the graph writes pattern 5 and nothing else.
  (void)gpu
      .submit({h.binding()},
              [](submit_context& c) { test_kernels::fill_pattern(c.resources[0].ptr, bytes, 6, c.stream); })
      .get();
  gpu.replay(graph).get();
  auto out = gpu.read(h.binding()).get();
  ASSERT_EQ(out.size(), bytes);
  void* copy = nullptr;
  ASSERT_EQ(cudaMalloc(&copy, bytes), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(copy, out.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  mismatch_counter bad;
  test_kernels::check_pattern(copy, bytes, 5, bad.d, nullptr);
  EXPECT_EQ(bad.value(), 0u) << "the graph replayed something besides its kernel";
  cudaFree(copy);
  graph = device_graph();
  EXPECT_EQ(gpu.check_invariants().get(), "");
  (void)staging_before;
}

// A kernel still running on stream A over memory whose handle was dropped: stream B never gets
// that memory before A's work is done (by address and by data), and gets it afterwards.
TEST(CudaStreams, MemoryFreedOnABusyStreamIsNotGivenToAnotherBeforeItsFence) {
  DEVRT_REQUIRE_GPU();
  devrt::runtime::runtime rt(gpu_options());
  auto gpu = rt.cuda(0);
  user_stream a;
  user_stream b;
  user_stream c;
  mismatch_counter bad;
  constexpr std::uint64_t bytes = 8ULL << 20;
  (void)gpu.reserve(4096, stream::native(b.s)).get();  // B is in use from the start
  memory_handle x = gpu.reserve(bytes, stream::native(a.s)).get();
  auto* const x_ptr = static_cast<std::byte*>(x.ptr());
  test_kernels::fill_pattern(x.ptr(), bytes, 1, a.s);
  test_kernels::spin_then_check(x.ptr(), bytes, 1, 200'000, bad.d, a.s);  // 200 ms
  x.reset();
  (void)gpu.memory_usage().get();  // the free is seen and fenced
  for (int i = 0; i < 8; ++i) {
    memory_handle y = gpu.reserve(bytes, stream::native(b.s)).get();
    auto* const y_ptr = static_cast<std::byte*>(y.ptr());
    EXPECT_TRUE(y_ptr + bytes <= x_ptr || x_ptr + bytes <= y_ptr) << "B got memory A's kernel still reads";
    test_kernels::fill_pattern(y.ptr(), bytes, 2, b.s);
  }
  EXPECT_EQ(bad.value(), 0u);
  // Once A's work is done, the memory is free for every stream: a third stream (B's own freed
  // memory stays B's first choice) gets it.
  ASSERT_EQ(cudaStreamSynchronize(a.s), cudaSuccess);
  // C keeps what it gets, so that no memory of its own competes with A's.
  bool reused = false;
  std::vector<memory_handle> kept;
  for (int i = 0; i < 100 && !reused; ++i) {
    (void)gpu.memory_usage().get();  // a batch: polls the fences
    kept.push_back(gpu.reserve(bytes, stream::native(c.s)).get());
    auto* const y_ptr = static_cast<std::byte*>(kept.back().ptr());
    reused = y_ptr < x_ptr + bytes && x_ptr < y_ptr + bytes;  // it may start elsewhere in a merged hole
  }
  EXPECT_TRUE(reused) << "A's memory never came back after its fence passed";
  gpu.retire_stream(stream::native(a.s)).get();
  gpu.retire_stream(stream::native(b.s)).get();
}

// record_stream: memory used on a second stream is not reused, even by its own stream, before
// the second stream's work is done.
TEST(CudaStreams, RecordStreamKeepsMemoryFromItsOwnStreamToo) {
  DEVRT_REQUIRE_GPU();
  devrt::runtime::runtime rt(gpu_options());
  auto gpu = rt.cuda(0);
  user_stream a;
  user_stream side;
  mismatch_counter bad;
  constexpr std::uint64_t bytes = 4ULL << 20;
  memory_handle x = gpu.reserve(bytes, stream::native(a.s)).get();
  void* const x_ptr = x.ptr();
  test_kernels::fill_pattern(x.ptr(), bytes, 9, a.s);
  cudaEvent_t filled = nullptr;
  cudaEventCreateWithFlags(&filled, cudaEventDisableTiming);
  cudaEventRecord(filled, a.s);
  cudaStreamWaitEvent(side.s, filled, 0);
  test_kernels::spin_then_check(x.ptr(), bytes, 9, 150'000, bad.d, side.s);
  gpu.record_stream(x, stream::native(side.s));
  x.reset();
  for (int i = 0; i < 8; ++i) {
    memory_handle y = gpu.reserve(bytes, stream::native(a.s)).get();
    EXPECT_NE(y.ptr(), x_ptr) << "A got memory the side stream still reads";
    test_kernels::fill_pattern(y.ptr(), bytes, 10, a.s);
  }
  EXPECT_EQ(bad.value(), 0u);
  cudaEventDestroy(filled);
  gpu.retire_stream(stream::native(a.s)).get();
  gpu.retire_stream(stream::native(side.s)).get();
}

// The defect of unmap batches: a mapping revived (same bounds) before its unmap happened and
// unmapped again belongs to the newer batch; the older batch's event must not release it while
// work queued between the two batches still uses it.
TEST(CudaStreams, ARevivedMappingIsReleasedOnlyByItsOwnBatch) {
  DEVRT_REQUIRE_GPU();
  devices::cuda_storage s(0);
  if (s.properties().map_granularity == 0) GTEST_SKIP() << "no virtual memory management on this GPU";
  auto* const q = static_cast<cudaStream_t>(s.native_stream());
  mismatch_counter bad;
  const std::uint64_t g = s.properties().map_granularity;
  auto range = s.reserve_range(16 * g, g).value();
  ASSERT_TRUE(s.map(range.id, 0, 4 * g));
  void* const p = s.get(memory::storage_handle{range.id, 0, 4 * g}).value().ptr;
  {
    stream_gate first(q);  // the stream is busy until the gate opens
    test_kernels::fill_pattern(p, 4 * g, 5, q);
    s.unmap(range.id, 0, 4 * g);
    ASSERT_TRUE(s.flush());                  // batch 1, behind the first gate and kernel
    ASSERT_TRUE(s.map(range.id, 0, 4 * g));  // revived before its unmap happened
    stream_gate second(q);
    test_kernels::fill_pattern(p, 4 * g, 6, q);
    test_kernels::check_pattern(p, 4 * g, 6, bad.d, q);  // work between the batches
    s.unmap(range.id, 0, 4 * g);
    ASSERT_TRUE(s.flush());  // batch 2, behind the second gate and that work
    EXPECT_EQ(s.idle_releases(), 0u) << "a busy stream was taken for an idle one";
    first.open();
    second.wait_reached();   // batch 1's event has completed, batch 2's has not
    ASSERT_TRUE(s.flush());  // completes batch 1: must not unmap
    EXPECT_EQ(s.mapped_bytes(), 4 * g) << "the older batch released a mapping of the newer one";
    second.open();
  }
  EXPECT_EQ(cudaStreamSynchronize(q), cudaSuccess);
  EXPECT_EQ(bad.value(), 0u);
  ASSERT_TRUE(s.flush());
  EXPECT_EQ(s.mapped_bytes(), 0u);
  EXPECT_EQ(s.gpu_waits(), 0u);
  s.release_range(range.id);
}

// An unmap goes back at once when nothing is left to run on the device's stream after it has
// joined every user's stream, and waits behind an event while a user's stream is still busy with
// the memory: the busy kernel reads it to the end (memcheck sees no access to unmapped memory).
TEST(CudaStreams, UnmapsGoBackAtOnceOnlyWhenNoStreamIsBusy) {
  DEVRT_REQUIRE_GPU();
  devices::cuda_storage s(0);
  if (s.properties().map_granularity == 0) GTEST_SKIP() << "no virtual memory management on this GPU";
  const std::uint64_t g = s.properties().map_granularity;
  user_stream a;
  const memory::stream_id qa = stream::native(a.s).id();
  s.return_after(qa);
  mismatch_counter bad;
  auto range = s.reserve_range(8 * g, g).value();

  // Idle: the memory is back after the flush, without an event.
  ASSERT_TRUE(s.map(range.id, 0, 2 * g));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  s.unmap(range.id, 0, 2 * g);
  EXPECT_EQ(s.returning_bytes(), 2 * g);
  ASSERT_TRUE(s.flush());
  EXPECT_EQ(s.returning_bytes(), 0u);
  EXPECT_EQ(s.mapped_bytes(), 0u);
  EXPECT_EQ(s.idle_releases(), 1u);

  // Busy: a kernel on the user's stream spins for 300 ms, then reads the memory; the unmap waits.
  // (A kernel rather than a host-function gate holds the stream, so memcheck can run the test.)
  ASSERT_TRUE(s.map(range.id, 2 * g, 2 * g));
  void* const p = s.get(memory::storage_handle{range.id, 2 * g, 2 * g}).value().ptr;
  test_kernels::fill_pattern(p, 2 * g, 41, a.s);
  test_kernels::spin_then_check(p, 2 * g, 41, 300'000, bad.d, a.s);
  s.unmap(range.id, 2 * g, 2 * g);
  ASSERT_TRUE(s.flush());
  EXPECT_EQ(s.returning_bytes(), 2 * g) << "memory a busy stream still reads went back";
  EXPECT_EQ(s.idle_releases(), 1u);
  ASSERT_EQ(cudaStreamSynchronize(a.s), cudaSuccess);
  // The batch's event is on the device's stream, behind its join of the user's stream.
  ASSERT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>(s.native_stream())), cudaSuccess);
  ASSERT_TRUE(s.flush());  // the batch's event has completed
  EXPECT_EQ(s.returning_bytes(), 0u);
  EXPECT_EQ(s.mapped_bytes(), 0u);
  EXPECT_EQ(bad.value(), 0u);
  EXPECT_EQ(s.gpu_waits(), 0u);
  s.release_range(range.id);
}

// An unmap the device takes back at once (nothing left to run) keeps its physical allocation for
// the maps of the same reserve: a map of the same size takes it at its new address, no cuMemCreate
// and no cuMemRelease; the next flush releases what no map took. The memory works at its new
// address on a busy stream.
TEST(CudaStreams, AnUnmapDoneAtOnceLendsItsMemoryToTheNextMapOfItsSize) {
  DEVRT_REQUIRE_GPU();
  devices::cuda_storage s(0);
  if (s.properties().map_granularity == 0) GTEST_SKIP() << "no virtual memory management on this GPU";
  const std::uint64_t g = s.properties().map_granularity;
  user_stream a;
  const memory::stream_id qa = stream::native(a.s).id();
  s.return_after(qa);
  mismatch_counter bad;
  auto range = s.reserve_range(8 * g, g).value();

  ASSERT_TRUE(s.map(range.id, 0, 2 * g));
  EXPECT_EQ(s.physical_allocations(), 1u);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  s.unmap(range.id, 0, 2 * g);
  ASSERT_TRUE(s.settle());
  EXPECT_EQ(s.kept_allocations(), 1u);
  EXPECT_EQ(s.kept_bytes(), 2 * g);
  EXPECT_EQ(s.returning_bytes(), 2 * g) << "kept memory is still held";
  EXPECT_EQ(s.mapped_bytes(), 0u);
  EXPECT_EQ(s.allocated_bytes(), 2 * g);

  // Same size, elsewhere: the kept allocation.
  ASSERT_TRUE(s.map(range.id, 4 * g, 2 * g));
  EXPECT_EQ(s.reused_allocations(), 1u);
  EXPECT_EQ(s.physical_allocations(), 1u) << "a map of the kept size created memory";
  EXPECT_EQ(s.kept_allocations(), 0u);
  EXPECT_EQ(s.returning_bytes(), 0u);
  EXPECT_EQ(s.allocated_bytes(), 2 * g);
  EXPECT_EQ(s.mapped_bytes(), 2 * g);
  void* const p = s.get(memory::storage_handle{range.id, 4 * g, 2 * g}).value().ptr;
  test_kernels::fill_pattern(p, 2 * g, 23, a.s);
  test_kernels::spin_then_check(p, 2 * g, 23, 2'000, bad.d, a.s);
  ASSERT_EQ(cudaStreamSynchronize(a.s), cudaSuccess);
  EXPECT_EQ(bad.value(), 0u);

  // Another size: the kept allocation goes back before new memory is created, so the device never
  // holds both.
  s.unmap(range.id, 4 * g, 2 * g);
  ASSERT_TRUE(s.settle());
  EXPECT_EQ(s.kept_allocations(), 1u);
  ASSERT_TRUE(s.map(range.id, 0, g));
  EXPECT_EQ(s.physical_allocations(), 2u);
  EXPECT_EQ(s.reused_allocations(), 1u);
  EXPECT_EQ(s.kept_allocations(), 0u);
  EXPECT_EQ(s.returning_bytes(), 0u);
  EXPECT_EQ(s.allocated_bytes(), g);
  // What no map takes goes back at the next flush.
  s.unmap(range.id, 0, g);
  ASSERT_TRUE(s.settle());
  EXPECT_EQ(s.kept_bytes(), g);
  ASSERT_TRUE(s.flush());
  EXPECT_EQ(s.kept_allocations(), 0u);
  EXPECT_EQ(s.returning_bytes(), 0u);
  EXPECT_EQ(s.allocated_bytes(), 0u);
  // Two kept: the next map takes the one of its size and the other goes back in the same call.
  ASSERT_TRUE(s.map(range.id, 0, g));
  ASSERT_TRUE(s.map(range.id, 2 * g, 2 * g));
  s.unmap(range.id, 0, g);
  s.unmap(range.id, 2 * g, 2 * g);
  ASSERT_TRUE(s.settle());
  EXPECT_EQ(s.kept_allocations(), 2u);
  EXPECT_EQ(s.returning_bytes(), 3 * g);
  ASSERT_TRUE(s.map(range.id, 5 * g, 2 * g));
  EXPECT_EQ(s.reused_allocations(), 2u);
  EXPECT_EQ(s.kept_allocations(), 0u);
  EXPECT_EQ(s.returning_bytes(), 0u) << "kept memory counted beside the new mapping";
  EXPECT_EQ(s.allocated_bytes(), 2 * g);
  EXPECT_EQ(s.gpu_waits(), 0u);
  s.release_range(range.id);
}

// Memory that queued work may still use is never lent: behind a busy stream (a kernel that spins,
// then reads the old memory) the unmap waits for its event, so a map of the same size creates new
// memory, and the kernel still sees the old bytes after the new memory was written on another
// stream. The stream is held by a kernel, not a host function, so memcheck can run the test.
TEST(CudaStreams, MemoryABusyStreamMayStillUseIsNeverLent) {
  DEVRT_REQUIRE_GPU();
  devices::cuda_storage s(0);
  if (s.properties().map_granularity == 0) GTEST_SKIP() << "no virtual memory management on this GPU";
  const std::uint64_t g = s.properties().map_granularity;
  user_stream a;
  user_stream b;
  const memory::stream_id qa = stream::native(a.s).id();
  const memory::stream_id qb = stream::native(b.s).id();
  s.return_after(qa);
  s.return_after(qb);
  mismatch_counter bad;
  auto range = s.reserve_range(8 * g, g).value();

  ASSERT_TRUE(s.map(range.id, 0, 2 * g));
  void* const old_p = s.get(memory::storage_handle{range.id, 0, 2 * g}).value().ptr;
  test_kernels::fill_pattern(old_p, 2 * g, 41, a.s);
  test_kernels::spin_then_check(old_p, 2 * g, 41, 300'000, bad.d, a.s);  // reads it 300 ms from now
  s.unmap(range.id, 0, 2 * g);
  ASSERT_TRUE(s.settle());
  const bool still_busy = cudaStreamQuery(a.s) == cudaErrorNotReady;
  EXPECT_EQ(s.kept_allocations(), 0u) << "memory a busy stream still reads was kept for reuse";
  if (still_busy) {
    EXPECT_EQ(s.returning_bytes(), 2 * g) << "memory a busy stream still reads went back";
  }
  ASSERT_TRUE(s.map(range.id, 4 * g, 2 * g));
  EXPECT_EQ(s.reused_allocations(), 0u);
  EXPECT_EQ(s.physical_allocations(), 2u);
  void* const new_p = s.get(memory::storage_handle{range.id, 4 * g, 2 * g}).value().ptr;
  test_kernels::fill_pattern(new_p, 2 * g, 99, b.s);
  ASSERT_EQ(cudaStreamSynchronize(b.s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(a.s), cudaSuccess);
  EXPECT_EQ(bad.value(), 0u) << "the old memory changed under a kernel that still read it";
  ASSERT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>(s.native_stream())), cudaSuccess);
  ASSERT_TRUE(s.flush());
  EXPECT_EQ(s.returning_bytes(), 0u);
  EXPECT_EQ(s.kept_allocations(), 0u);
  EXPECT_EQ(s.allocated_bytes(), 2 * g);
  EXPECT_EQ(s.gpu_waits(), 0u);
  s.release_range(range.id);
}

// The arena unmaps free memory behind busy streams and maps there again: the device thread never
// waits for a pending unmap (the arena maps exactly what it unmapped, which the storage revives).
TEST(CudaStreams, MappingOverAPendingUnmapNeverWaits) {
  DEVRT_REQUIRE_GPU();
  auto store = memory::storage::make<devices::cuda_storage>(0);
  auto* cuda = store.backend<devices::cuda_storage>();
  if (cuda->properties().map_granularity == 0) GTEST_SKIP() << "no virtual memory management on this GPU";
  memory::manager_options opts;
  opts.layout = memory::parse_layout("arena:slack=0").value();  // free memory is unmapped at once
  memory::memory_manager m(std::move(store), opts);
  user_stream a;
  mismatch_counter bad;
  const memory::stream_id qa = stream::native(a.s).id();
  for (int round = 0; round < 20; ++round) {
    const std::uint64_t bytes = (1 + round % 5) * (6ULL << 20) + 4096ULL * round;
    auto h = m.reserve(bytes, qa).value();
    const std::uint32_t seed = 100U + static_cast<std::uint32_t>(round);
    test_kernels::fill_pattern(h.ptr(), bytes / 4 * 4, seed, a.s);
    test_kernels::spin_then_check(h.ptr(), bytes / 4 * 4, seed, 20'000, bad.d, a.s);
    h.reset();
    ASSERT_TRUE(m.end_batch());  // unmaps behind the busy stream
  }
  EXPECT_EQ(cuda->gpu_waits(), 0u) << "a map waited for the GPU";
  EXPECT_EQ(bad.value(), 0u);
  EXPECT_EQ(m.check_invariants(), "");
  ASSERT_EQ(m.retire_stream(qa).code(), errc::ok);
}

// Under a memory limit, memory a busy stream still reads (kept for the stream until its fence
// passes, or unmapped behind it) counts against the limit. A reserve that needs it waits for the
// stream's fence (memory pressure, the one place the device waits, counted in stream_waits; a
// cleanup, counted in reclaims, follows only when that is not enough), so it succeeds within the
// limit, and the kernel still reading the old memory reads it to the end (memcheck sees no access
// to unmapped memory).
TEST(CudaStreams, AReclaimUnderTheLimitWaitsForMemoryABusyStreamStillReads) {
  DEVRT_REQUIRE_GPU();
  auto store = memory::storage::make<devices::cuda_storage>(0);
  auto* cuda = store.backend<devices::cuda_storage>();
  if (cuda->properties().map_granularity != 2ULL << 20)
    GTEST_SKIP() << "the test's sizes assume mappings of 2 MiB granules";
  constexpr std::uint64_t mib = 1ULL << 20;
  memory::manager_options opts;
  opts.layout = memory::parse_layout("arena:space=256MiB,grow=0").value();
  opts.memory_limit = 48 * mib;
  opts.reclaim_on_out_of_memory = true;  // as the runtime sets it
  memory::memory_manager m(std::move(store), opts);
  user_stream a;
  mismatch_counter bad;
  const memory::stream_id qa = stream::native(a.s).id();

  auto x = m.reserve(32 * mib, qa).value();
  auto guard = m.reserve(2 * mib, qa).value();  // keeps x's hole apart from the arena's free end
  test_kernels::fill_pattern(x.ptr(), 32 * mib, 61, a.s);
  test_kernels::spin_then_check(x.ptr(), 32 * mib, 61, 300'000, bad.d, a.s);
  ASSERT_TRUE(m.end_batch());
  x.reset();
  ASSERT_TRUE(m.cleanup(true));
  // x's memory stays with its stream until the stream's fence passes (then it is unmapped, behind
  // the device's own stream): while the kernel reads it the device holds it, and the limit counts it.
  {
    const memory::memory_statistics& st = m.statistics();
    EXPECT_GE(st.bytes_reserved + st.bytes_returning, 34 * mib);
    ASSERT_GE(cuda->allocated_bytes(), 34 * mib) << "memory a busy stream still reads went back";
  }
  const std::uint64_t waits = m.statistics().stream_waits;
  const std::uint64_t reclaims = m.statistics().reclaims;

  // 40 MiB fits neither x's hole nor, with x's memory still held, the limit: the reserve waits.
  auto y = m.reserve(40 * mib, qa);
  ASSERT_TRUE(y) << y.err().message();
  EXPECT_LE(m.statistics().reclaims, reclaims + 1);
  EXPECT_GE(m.statistics().stream_waits, waits + 1) << "the wait for the stream's fence was not counted";
  EXPECT_EQ(m.statistics().bytes_returning, 0u);
  EXPECT_LE(m.statistics().bytes_reserved, 48 * mib);
  EXPECT_LE(cuda->allocated_bytes(), 48 * mib) << "the device held more than the limit";
  test_kernels::fill_pattern(y.value().ptr(), 40 * mib, 62, a.s);
  test_kernels::spin_then_check(y.value().ptr(), 40 * mib, 62, 1'000, bad.d, a.s);
  ASSERT_EQ(cudaStreamSynchronize(a.s), cudaSuccess);
  EXPECT_EQ(bad.value(), 0u) << "a kernel read memory that changed or went away under it";
  EXPECT_EQ(m.check_invariants(), "");
  y.value().reset();
  guard.reset();
  ASSERT_EQ(m.retire_stream(qa).code(), errc::ok);
}

// One stream blocked for 100 ms while 15 other threads reserve and free: their reserves are not
// held behind it (the blocked thread's read completes from an event, not on the device thread).
TEST(CudaStreams, ABlockedStreamDoesNotStallOtherClients) {
  DEVRT_REQUIRE_GPU();
  devrt::runtime::runtime rt(gpu_options());
  auto gpu = rt.cuda(0);
  user_stream slow;
  memory_handle h = gpu.reserve(1 << 20, stream::native(slow.s)).get();
  test_kernels::fill_pattern(h.ptr(), 1 << 20, 3, slow.s);
  test_kernels::spin(100'000, slow.s);
  auto read = gpu.read(h.binding());  // ordered after the spin on the slow stream
  std::atomic<bool> go{false};
  std::vector<std::vector<double>> lat(15);
  std::vector<std::thread> pool;
  for (int t = 0; t < 15; ++t) {
    pool.emplace_back([&, t] {
      user_stream own;
      while (!go.load()) std::this_thread::yield();
      for (int i = 0; i < 400; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        memory_handle x = gpu.reserve(4096ULL * (1 + (i % 64)), stream::native(own.s)).get();
        lat[t].push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      }
      gpu.retire_stream(stream::native(own.s)).get();
    });
  }
  go = true;
  for (auto& th : pool) th.join();
  const bool read_done_early = read.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  auto bytes = read.get();
  std::vector<double> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  const double p50 = all[all.size() / 2];
  const double p99 = all[all.size() * 99 / 100];
  std::printf("[ blocked  ] 15 threads x 400 reserves beside a stream blocked for 100 ms: p50 %.1f us, p99 %.1f us%s\n",
              p50, p99, read_done_early ? " (the read finished first)" : "");
  EXPECT_LT(p99, 20'000.0) << "reserves waited behind the blocked stream";
  ASSERT_EQ(bytes.size(), 1u << 20);
  gpu.retire_stream(stream::native(slow.s)).get();
}

// A graph that outlives its runtime is safe to drop.
TEST(CudaStreams, AGraphThatOutlivesItsRuntime) {
  DEVRT_REQUIRE_GPU();
  device_graph graph;
  {
    devrt::runtime::runtime rt(gpu_options());
    auto gpu = rt.cuda(0);
    auto h = gpu.create(1 << 20);
    (void)gpu
        .submit(
            {h.binding()},
            [](submit_context& c) { test_kernels::fill_pattern(c.resources[0].ptr, c.resources[0].size, 4, c.stream); })
        .get();
    gpu.capture_begin().get();
    (void)gpu
        .submit(
            {h.binding()},
            [](submit_context& c) { test_kernels::fill_pattern(c.resources[0].ptr, c.resources[0].size, 5, c.stream); })
        .get();
    graph = gpu.capture_end().get();
    ASSERT_TRUE(graph.recorded());
    gpu.replay(graph).get();
    gpu.replay(graph).get();
  }  // the runtime is gone, the graph still lives
  graph = device_graph();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// Frees queued when a capture starts are flushed before it, never into the graph.
TEST(CudaStreams, ACaptureStartedWithFreesQueuedKeepsThemOutOfTheGraph) {
  DEVRT_REQUIRE_GPU();
  devices::cuda_storage s(0);
  auto page = s.alloc(1 << 20).value();
  auto scratch = s.alloc(1 << 20).value();
  void* const scratch_ptr = s.get(scratch).value().ptr;
  s.dealloc(page.id);  // queued, not flushed
  ASSERT_TRUE(s.begin_capture());
  EXPECT_EQ(s.driver_frees(), 1u) << "the queued free was not flushed before the capture";
  test_kernels::fill_pattern(scratch_ptr, 1 << 20, 7, s.native_stream());
  ASSERT_TRUE(s.flush());  // the actor flushes after every batch: nothing may reach the graph
  auto work = s.end_capture().value();
  ASSERT_NE(work, nullptr);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(work->launch());
  EXPECT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>(s.native_stream())), cudaSuccess);
  EXPECT_EQ(s.driver_frees(), 1u);
  work.reset();
}

// Reads and synchronization complete from events: a read of memory written by a slow kernel
// returns the kernel's bytes, and the device keeps serving meanwhile.
TEST(CudaStreams, ReadsCompleteFromEventsWithTheKernelsBytes) {
  DEVRT_REQUIRE_GPU();
  devrt::runtime::runtime rt(gpu_options());
  auto gpu = rt.cuda(0);
  user_stream a;
  memory_handle h = gpu.reserve(1 << 16, stream::native(a.s)).get();
  std::vector<std::byte> ones(1 << 16, std::byte{1});
  gpu.write(h.binding(), ones).get();
  test_kernels::spin(50'000, a.s);
  test_kernels::fill_pattern(h.ptr(), 1 << 16, 11, a.s);  // after the write, on the same stream
  auto read = gpu.read(h.binding());
  auto sync = gpu.synchronize(stream::native(a.s));
  // Meanwhile the device serves others.
  for (int i = 0; i < 100; ++i) (void)gpu.reserve(4096).get();
  sync.get();
  auto bytes = read.get();
  ASSERT_EQ(bytes.size(), 1u << 16);
  EXPECT_NE(bytes[0], std::byte{1}) << "the read overtook the kernel on the allocation's stream";
  // Compare with the pattern through the GPU itself.
  mismatch_counter bad;
  void* copy = nullptr;
  ASSERT_EQ(cudaMalloc(&copy, 1 << 16), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(copy, bytes.data(), 1 << 16, cudaMemcpyHostToDevice), cudaSuccess);
  test_kernels::check_pattern(copy, 1 << 16, 11, bad.d, nullptr);
  EXPECT_EQ(bad.value(), 0u);
  cudaFree(copy);
  gpu.retire_stream(stream::native(a.s)).get();
}

// A request that finds the device idle is served on the calling thread. A thread that captures
// its own stream into a graph (in either capture mode) reserves memory for the graph: the reserve
// maps memory there, in place, without breaking the capture or leaving an error behind, and the
// thread's capture mode is what it was. In global mode neither may another thread's request (also
// served in place) nor the device thread's own work. Memory for the capturing stream itself is
// refused with capture_active (CUDA names a stream only outside a capture), and the capture lives.
TEST(CudaStreams, AThreadCapturingItsOwnStreamReservesInPlaceAndTheGraphRuns) {
  DEVRT_REQUIRE_GPU();
  for (const cudaStreamCaptureMode mode : {cudaStreamCaptureModeThreadLocal, cudaStreamCaptureModeGlobal}) {
    SCOPED_TRACE(mode == cudaStreamCaptureModeGlobal ? "global capture" : "thread-local capture");
    runtime_options o = gpu_options();
    o.idle_spin = std::chrono::microseconds(0);  // the device thread sleeps as soon as it is idle
    devrt::runtime::runtime rt(o);
    auto gpu = rt.cuda(0);
    (void)gpu.reserve(4096).get();
    user_stream busy;
    test_kernels::spin(20'000, busy.s);  // the GPU is busy on another stream throughout
    user_stream s;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    cudaStreamCaptureMode thread_mode = mode;
    ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&thread_mode), cudaSuccess);
    const cudaStreamCaptureMode outer_mode = thread_mode;
    ASSERT_EQ(cudaStreamBeginCapture(s.s, mode), cudaSuccess);
    try {
      (void)gpu.reserve(1 << 20, stream::native(s.s)).get();
      ADD_FAILURE() << "a reserve for a capturing stream was served";
    } catch (const boost::system::system_error& e) {
      EXPECT_EQ(e.code(), errc::capture_active) << e.what();
      EXPECT_NE(std::string(e.what()).find("capturing a CUDA graph"), std::string::npos) << e.what();
    }
    const auto in_place = gpu.actor()->served_in_place();
    constexpr std::uint64_t bytes = 6 << 20;  // new memory: the reserve maps
    memory_handle h = gpu.reserve(bytes).get();
    EXPECT_GT(gpu.actor()->served_in_place(), in_place) << "the reserve was not served in place: nothing new checked";
    memory_handle other;
    if (mode == cudaStreamCaptureModeGlobal) {
      // Another thread's request, and work on the device thread (a free it makes, a function it
      // runs, the end of its batch).
      std::thread([&] { other = gpu.reserve(10 << 20).get(); }).join();
      other.reset();
      (void)gpu.submit({}, [](submit_context&) {}).get();
      std::thread([&] { other = gpu.reserve(12 << 20).get(); }).join();
    }
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    EXPECT_EQ(cudaStreamIsCapturing(s.s, &status), cudaSuccess);
    EXPECT_EQ(status, cudaStreamCaptureStatusActive) << "the reserve broke the capture";
    cudaStreamCaptureMode now = cudaStreamCaptureModeRelaxed;
    ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&now), cudaSuccess);
    EXPECT_EQ(now, mode) << "the thread's capture mode was not put back";
    ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&now), cudaSuccess);
    int device = -1;
    EXPECT_EQ(cudaGetDevice(&device), cudaSuccess);
    EXPECT_EQ(device, 0);
    test_kernels::fill_pattern(h.ptr(), bytes, 21, s.s);
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamEndCapture(s.s, &graph), cudaSuccess);
    ASSERT_NE(graph, nullptr);
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, s.s), cudaSuccess);
    mismatch_counter bad;
    test_kernels::check_pattern(h.ptr(), bytes, 21, bad.d, s.s);
    EXPECT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
    EXPECT_EQ(bad.value(), 0u) << "the graph did not write the memory reserved during its capture";
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    thread_mode = outer_mode;
    ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&thread_mode), cudaSuccess);
    h.reset();
    other.reset();
    EXPECT_EQ(gpu.check_invariants().get(), "");
  }
}
