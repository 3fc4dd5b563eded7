// Stream order through the actor with many client threads, on a simulated device with streams:
// each thread has streams of its own that it creates and destroys, its frees record their fences
// on its own thread while the device takes them, memory moves between streams through
// record_stream, and a thread of its own lets the simulated GPU progress. Run under ThreadSanitizer
// in CI: the free-time fences are the one place where threads other than the device's touch the
// stream order.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "devrt/devices/sim_storage.hpp"
#include "devrt/runtime/runtime.hpp"
#include "runtime_test_util.hpp"

using namespace devrt;
using namespace devrt::runtime;
using memory::memory_handle;
using memory::stream;

namespace {

constexpr std::uint64_t mib = 1ULL << 20;

devices::sim_storage* sim_of(const compute_client& c) {
  return c
      .async_run<devices::sim_storage*>(
          [](actor_core& core) {
            return result<devices::sim_storage*>(core.manager().backing_storage().backend<devices::sim_storage>());
          },
          use_future_t{})
      .get();
}

}  // namespace

TEST(StreamThreads, SixteenThreadsWithStreamsTheyCreateAndDestroy) {
  runtime_options o = devrt_test::quiet_options();
  devices::sim_options so;
  so.streams = true;
  so.deferred_unmaps = true;
  so.props.map_granularity = 2 * mib;
  so.props.capacity = 2048 * mib;
  o.sim = so;
  o.sim_layout = memory::preset::automatic;
  devrt::runtime::runtime rt(o);
  compute_client c = rt.sim();
  devices::sim_storage* sim = sim_of(c);
  std::atomic<bool> done{false};
  std::thread gpu([&] {  // the simulated GPU: streams progress while the clients work
    std::mt19937 rng(7);
    while (!done.load()) {
      if (rng() % 8 == 0) {
        sim->progress();
      } else {
        sim->progress_stream(static_cast<memory::stream_id>(0x100000 + 0x100 * (rng() % 64)));
      }
      std::this_thread::yield();
    }
  });
  std::atomic<int> failures{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 16; ++t) {
    clients.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t) + 1);
      memory::stream_id mine = sim->create_stream();
      std::vector<memory_handle> live;
      for (int i = 0; i < 600; ++i) {
        const std::uint64_t op = rng() % 10;
        try {
          if (op < 4 || live.empty()) {
            live.push_back(c.reserve(4096ULL * (1 + rng() % 256), stream::native(reinterpret_cast<void*>(mine))).get());
            (void)sim->record_event(mine);  // a kernel on the thread's stream
          } else if (op < 5) {
            // Another stream of this thread's uses it too.
            const memory::stream_id other = sim->create_stream();
            const std::size_t k = rng() % live.size();
            c.record_stream(live[k], stream::native(reinterpret_cast<void*>(other))).get();
            (void)sim->record_event(other);
            live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));  // freed, with both fences, before `other` goes
            sim->destroy_stream(other);
          } else if (op < 9) {
            live.erase(live.begin() + static_cast<std::ptrdiff_t>(rng() % live.size()));  // a free on this thread
          } else {
            // The stream goes, its memory freed first, its work still queued; a new one comes.
            live.clear();
            sim->destroy_stream(mine);
            mine = sim->create_stream();
          }
        } catch (const std::exception& e) {
          failures.fetch_add(1);
          ADD_FAILURE() << "thread " << t << " step " << i << ": " << e.what();
          return;
        }
      }
      live.clear();
    });
  }
  for (auto& th : clients) th.join();
  done = true;
  gpu.join();
  EXPECT_EQ(failures.load(), 0);
  sim->progress();
  c.cleanup().get();
  sim->progress();
  c.cleanup().get();
  const auto s = c.statistics().get();
  EXPECT_EQ(c.check_invariants().get(), "");
  EXPECT_EQ(c.memory_usage().get().number_allocs, 0u);
  EXPECT_LE(s.streams, 24u) << "registrations of streams that are gone stayed";
  EXPECT_GE(s.stream_registrations, 16u);
  std::printf("[ streams  ] 16 threads: %llu registrations made, %llu alive at the end, %llu fences, %llu waits\n",
              static_cast<unsigned long long>(s.stream_registrations), static_cast<unsigned long long>(s.streams),
              static_cast<unsigned long long>(s.fences), static_cast<unsigned long long>(s.stream_waits));
}

// record_stream's errors reach the caller (the C interface and Python raise them from the same
// future): a stream the device cannot identify leaves the memory as it was.
TEST(StreamThreads, RecordStreamErrorsReachTheCaller) {
  runtime_options o = devrt_test::quiet_options();
  devices::sim_options so;
  so.streams = true;
  so.props.map_granularity = 2 * mib;
  o.sim = so;
  o.sim_layout = memory::preset::automatic;
  devrt::runtime::runtime rt(o);
  compute_client c = rt.sim();
  devices::sim_storage* sim = sim_of(c);
  memory_handle h = c.reserve(mib, stream::native(reinterpret_cast<void*>(0x1000))).get();
  sim->fail_next_identify();
  auto f = devrt_test::failure_of(c.record_stream(h, stream::native(reinterpret_cast<void*>(0x2000))));
  EXPECT_EQ(f.code, errc::device_error) << f.what;
  EXPECT_NE(f.what.find("identifying a stream"), std::string::npos) << f.what;
  // A stream of another device is tracked, not refused; a reserve for it is refused.
  const memory::stream_id foreign = sim->create_stream(1);
  c.record_stream(h, stream::native(reinterpret_cast<void*>(foreign))).get();
  auto r = devrt_test::failure_of(c.reserve(mib, stream::native(reinterpret_cast<void*>(foreign))));
  EXPECT_EQ(r.code, errc::invalid_argument) << r.what;
  h.reset();
  sim->progress();
  c.cleanup().get();
  EXPECT_EQ(c.check_invariants().get(), "");
}
