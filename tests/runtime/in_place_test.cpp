// Requests served in place: a request that finds its device's actor idle runs on the calling
// thread (device_actor::run_or_post), so a device thread that has gone to sleep is not woken. The
// actor must still run one message at a time, in each thread's order, hand what others queue
// meanwhile to the device thread, keep polling work parked on events, and shut down cleanly while
// callers serve requests. Run under ThreadSanitizer in CI.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <random>
#include <thread>
#include <vector>

#include "devrt/devices/sim_storage.hpp"
#include "devrt/runtime/runtime.hpp"
#include "runtime_test_util.hpp"

using devrt::errc;
using devrt::result;
using devrt::memory::memory_handle;
using devrt::runtime::actor_core;
using devrt::runtime::compute_client;
using devrt::runtime::runtime;
using devrt::runtime::runtime_options;
using devrt::runtime::submit_context;
using devrt::runtime::system_error;
using devrt::runtime::use_future_t;
namespace devices = devrt::devices;

namespace {

runtime_options sleeping_device() {
  runtime_options o = devrt_test::quiet_options();
  o.idle_spin = std::chrono::microseconds(0);  // the device thread sleeps as soon as it is idle
  return o;
}

/// The simulated device's storage (asked on the device thread).
devices::sim_storage* sim_storage_of(const compute_client& c) {
  return c
      .async_run<devices::sim_storage*>(
          [](actor_core& core) {
            return result<devices::sim_storage*>(core.manager().backing_storage().backend<devices::sim_storage>());
          },
          use_future_t{}, compute_client::placement::device_thread)
      .get();
}

bool ready(auto& f) { return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready; }

TEST(InPlace, ARequestToAnIdleActorIsServedBeforeItsCallReturns) {
  runtime rt(sleeping_device());
  compute_client c = rt.host();
  (void)c.reserve(64).get();  // the device has started and gone idle
  ASSERT_TRUE(devrt_test::wait_until([&] { return c.actor()->served_in_place() + c.actor()->drains() >= 1; }));
  const auto drains = c.actor()->drains();
  const auto in_place = c.actor()->served_in_place();
  auto f = c.reserve(1 << 20);
  EXPECT_TRUE(ready(f)) << "the reserve was left to the device thread although the actor was idle";
  memory_handle h = f.get();
  EXPECT_EQ(h.size(), 1u << 20);
  memory_handle g = c.create(4096);  // a create too
  EXPECT_EQ(c.memory_usage().get().number_allocs, 2u);
  EXPECT_EQ(c.actor()->served_in_place() - in_place, 3u);
  EXPECT_EQ(c.actor()->drains(), drains) << "the sleeping device thread was woken";
}

TEST(InPlace, SwitchedOffEveryRequestGoesToTheDeviceThread) {
  runtime_options o = sleeping_device();
  o.serve_in_place = false;
  runtime rt(o);
  EXPECT_FALSE(rt.config().serve_in_place);
  compute_client c = rt.host();
  const auto drains = c.actor()->drains();
  for (int i = 0; i < 20; ++i) {
    memory_handle h = c.reserve(1 << 20).get();
    EXPECT_EQ(h.size(), 1u << 20);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  EXPECT_EQ(c.actor()->served_in_place(), 0u);
  EXPECT_GE(c.actor()->drains() - drains, 20u) << "each request to a sleeping device thread is one drain";
}

TEST(InPlace, SubmitRunsOnTheDeviceThreadEvenWhenTheActorIsIdle) {
  runtime rt(sleeping_device());
  compute_client c = rt.host();
  (void)c.reserve(64).get();
  const auto caller = std::this_thread::get_id();
  for (int i = 0; i < 20; ++i) {
    auto where = c.submit({}, [](submit_context&) { return std::this_thread::get_id(); }).get();
    EXPECT_NE(where, caller) << "a caller's function ran in place on the caller's thread";
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

TEST(InPlace, CaptureWindowsOpenAndCloseOnTheDeviceThread) {
  // CUDA ends a capture only on the thread that began it: both ends go to the device thread.
  runtime rt(sleeping_device());
  compute_client c = rt.host();
  (void)c.reserve(64).get();
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const auto in_place = c.actor()->served_in_place();
  c.capture_begin().get();
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  auto graph = c.capture_end().get();
  EXPECT_EQ(c.actor()->served_in_place(), in_place) << "a capture window was opened or closed in place";
}

TEST(InPlace, NoRequestRunsInPlaceWhileTheDeviceThreadRunsTheActor) {
  runtime rt(sleeping_device());
  compute_client c = rt.host();
  std::promise<void> gate;
  std::atomic<bool> inside{false};
  auto busy = c.submit({}, [&inside, opened = gate.get_future().share()](submit_context&) {
    inside = true;
    opened.wait();
  });
  ASSERT_TRUE(devrt_test::wait_until([&] { return inside.load(); }));
  // From other threads too: the actor is taken, so every request waits for the device thread.
  std::vector<devrt::runtime::future<memory_handle>> waiting;
  std::thread other([&] {
    for (int i = 0; i < 8; ++i) waiting.push_back(c.reserve(4096));
  });
  other.join();
  for (int i = 0; i < 8; ++i) waiting.push_back(c.reserve(4096));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  for (auto& f : waiting) EXPECT_FALSE(ready(f)) << "a request ran while the device thread ran the actor";
  EXPECT_EQ(c.actor()->served_in_place(), 0u);
  gate.set_value();
  busy.get();
  for (auto& f : waiting) EXPECT_EQ(f.get().size(), 4096u);
}

TEST(InPlace, EachThreadsRequestsKeepTheirOrder) {
  // A create then drops and reserves from one thread: whichever runner serves them, the create is
  // bound before the size query that follows it, and the counts add up.
  runtime rt(sleeping_device());
  compute_client c = rt.host();
  constexpr int threads = 8;
  std::atomic<int> wrong{0};
  // Both runners must have served some requests for the test to check anything: on a loaded
  // machine the threads may never meet in one round, so a few rounds are allowed.
  for (int round = 0; round < 5 && (round == 0 || c.actor()->drains() == 0); ++round) {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t, round] {
        std::mt19937 rng(static_cast<unsigned>(t + 100 * round) + 11);
        for (int i = 0; i < 400; ++i) {
          const std::uint64_t size = 256 + rng() % 65536;
          memory_handle h = c.create(size);
          if (c.get_resource(h.binding()).get().size != size) wrong.fetch_add(1);
          if (rng() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 200));
        }
      });
    }
    for (auto& th : pool) th.join();
  }
  EXPECT_EQ(wrong.load(), 0);
  c.synchronize().get();
  EXPECT_EQ(c.check_invariants().get(), "");
  EXPECT_EQ(c.memory_usage().get().number_allocs, 0u);
  EXPECT_GT(c.actor()->served_in_place(), 0u) << "no request was served in place: the test checked nothing new";
  EXPECT_GT(c.actor()->drains(), 0u) << "no request was handed to the device thread: the test checked nothing new";
}

TEST(InPlace, WorkParkedByARequestServedInPlaceStillCompletes) {
  // A configure waits for the fences of memory freed on a busy stream of a simulated device:
  // served in place, it parks, and the device thread must take over the polling, since nobody
  // else will ask again.
  runtime_options o = sleeping_device();
  devices::sim_options so;
  so.streams = true;
  o.sim = so;
  runtime rt(o);
  compute_client c = rt.sim();
  devices::sim_storage* sim = sim_storage_of(c);
  ASSERT_NE(sim, nullptr);
  const devrt::memory::stream_id s = sim->create_stream();
  {
    memory_handle h = c.reserve(1 << 20, devrt::memory::stream::native(reinterpret_cast<void*>(s))).get();
    (void)sim->record_event(s);  // a kernel on the stream, still queued when the memory is freed
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(2));  // the actor is idle again
  const auto in_place = c.actor()->served_in_place();
  auto f = c.configure(devrt::memory::preset::exclusive_pages);
  EXPECT_EQ(c.actor()->served_in_place(), in_place + 1) << "the configure was not served in place";
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_FALSE(ready(f)) << "the configure completed before the stream's work was done";
  sim->progress();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(30)), std::future_status::ready) << "nobody polled the parked configure";
  EXPECT_TRUE(f.get().applied);
}

TEST(InPlace, ACallerServingItselfAsksABusyDeviceForItsProgressOnlyEveryFewRequests) {
  // A thread allocating on its own stream (a request's stream, a framework's side stream) is
  // served in place while the GPU runs far behind, so the fence of the stream's last frees stays
  // in flight for thousands of calls. Each query of it is a driver call: a caller asks only every
  // few requests, yet the device's progress is seen within that many, and the stream reuses its
  // own memory all along.
  runtime_options o = sleeping_device();
  devices::sim_options so = devices::sim_options::h200();
  so.streams = true;
  o.sim = so;
  o.sim_layout = devrt::memory::preset::automatic;  // an arena, as on a GPU: frees tagged with their stream
  runtime rt(o);
  compute_client c = rt.sim();
  devices::sim_storage* sim = sim_storage_of(c);
  ASSERT_NE(sim, nullptr);
  const auto mine = devrt::memory::stream::native(reinterpret_cast<void*>(sim->create_stream()));
  (void)c.reserve(1 << 20, mine).get();
  std::this_thread::sleep_for(std::chrono::milliseconds(2));  // the actor is idle again
  const std::uint64_t reserved = c.statistics().get().bytes_reserved;
  const auto in_place = c.actor()->served_in_place();
  const std::uint64_t queries = sim->queries();
  constexpr int requests = 1024;
  for (int i = 0; i < requests; ++i) {
    memory_handle h = c.reserve(1 << 20, mine).get();
    ASSERT_EQ(h.size(), 1u << 20);
  }
  ASSERT_GE(c.actor()->served_in_place() - in_place, requests * 9 / 10) << "the requests were not served in place";
  const std::uint64_t asked = sim->queries() - queries;
  EXPECT_LE(asked, requests / devrt::memory::memory_manager::poll_in_place_every + 4)
      << "the callers asked the device about its fence at nearly every request";
  const devrt::memory::memory_statistics before = c.statistics().get();
  EXPECT_EQ(before.bytes_reserved, reserved) << "the stream did not reuse its own memory";
  EXPECT_GE(before.fences, 1u) << "no fence was taken: nothing was in flight to ask about";

  sim->progress();  // the device catches up: the fence in flight passes
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  // Within poll_in_place_every requests the pass is seen, and the next batch takes a new fence for
  // the frees made since.
  for (int i = 0; i < 96; ++i) {
    memory_handle h = c.reserve(1 << 20, mine).get();
    ASSERT_EQ(h.size(), 1u << 20);
  }
  EXPECT_GT(c.statistics().get().fences, before.fences) << "the passed fence was never seen";
}

TEST(InPlace, DeallocationsARequestLeavesAreMadeOnTheDeviceThread) {
  // Exclusive pages that give free pages back every few requests: a request that frees pages
  // queues their deallocations. A caller serving in place leaves them to the device thread, after
  // its answer, so no driver call lengthens a request.
  runtime_options o = sleeping_device();
  o.sim = devices::sim_options{};
  devrt::memory::exclusive_pool_config pages;
  pages.max_alloc_size = 64 << 20;
  pages.dealloc_period = 2;
  o.sim_layout = std::vector<devrt::memory::pool_config>{pages};
  runtime rt(o);
  compute_client c = rt.sim();
  devices::sim_storage* sim = sim_storage_of(c);
  ASSERT_NE(sim, nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const auto in_place = c.actor()->served_in_place();
  for (std::uint64_t mib = 1; mib <= 32; ++mib) {
    memory_handle h = c.reserve(mib << 20).get();
    EXPECT_EQ(h.size(), mib << 20);
    h.reset();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_GT(c.actor()->served_in_place(), in_place) << "nothing was served in place: the test checked nothing new";
  const auto flushed = [&] {
    return c.submit({}, [s = sim](submit_context&) { return s->pending_deallocations(); }).get() == 0;
  };
  ASSERT_TRUE(devrt_test::wait_until(flushed)) << "queued deallocations were never made";
  const auto threads = c.submit({}, [s = sim](submit_context&) { return s->flush_threads(); }).get();
  ASSERT_FALSE(threads.empty()) << "no deallocation was queued: the test checked nothing";
  for (const auto& t : threads) EXPECT_NE(t, std::this_thread::get_id()) << "a caller made the driver's unmaps";
}

TEST(InPlace, AShutdownWhileCallersServeRequestsLosesNothing) {
  for (int round = 0; round < 20; ++round) {
    auto rt = std::make_unique<runtime>(sleeping_device());
    compute_client c = rt->host();
    std::atomic<bool> go{false};
    std::atomic<int> served{0};
    std::atomic<int> refused{0};
    std::atomic<int> other{0};
    std::vector<std::thread> pool;
    for (int t = 0; t < 4; ++t) {
      pool.emplace_back([&] {
        while (!go.load()) std::this_thread::yield();
        for (int i = 0; i < 200; ++i) {
          try {
            memory_handle h = c.reserve(4096 + 64 * static_cast<std::uint64_t>(i)).get();
            served.fetch_add(1);
          } catch (const system_error& e) {
            (e.code() == make_error_code(errc::shutdown) ? refused : other).fetch_add(1);
          }
        }
      });
    }
    go = true;
    std::this_thread::sleep_for(std::chrono::microseconds(100 * (round % 5)));
    rt->shutdown();
    for (auto& th : pool) th.join();
    EXPECT_EQ(served.load() + refused.load(), 4 * 200);
    EXPECT_EQ(other.load(), 0);
  }
}

}  // namespace
