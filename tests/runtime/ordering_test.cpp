// Ordering and batching: messages posted by one thread run in the order posted; create followed
// by any use never sees an unbound handle; a burst of messages is served in few drains.

#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/detached.hpp>
#include <cstdint>
#include <cstdio>
#include <future>
#include <thread>
#include <utility>
#include <vector>

#include "devrt/runtime/runtime.hpp"
#include "runtime_test_util.hpp"

namespace {

using devrt::errc;
using devrt::memory::memory_handle;
using devrt::runtime::compute_client;
using devrt::runtime::runtime;
using devrt::runtime::submit_context;
using devrt_test::quiet_options;

TEST(Ordering, EachThreadsMessagesRunInTheOrderPosted) {
  runtime rt(quiet_options());
  compute_client c = rt.host();
  constexpr int threads = 8;
  constexpr int per_thread = 10'000;
  // Touched only on the device strand (the submits), read after the final round trip.
  std::vector<std::pair<int, int>> log;
  log.reserve(threads * per_thread);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int i = 0; i < per_thread; ++i) {
        // Alternate completion styles: ordering is a property of posting, not of the token.
        auto fn = [&log, t, i](submit_context&) { log.emplace_back(t, i); };
        if (i % 3 == 0) {
          c.submit({}, fn, boost::asio::detached);
        } else if (i % 3 == 1) {
          (void)c.submit({}, fn);
        } else {
          c.submit({}, fn, [](boost::system::error_code) {});
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  // Posted after every thread's last message, so it runs after all of them.
  EXPECT_EQ(c.submit({}, [&log](submit_context&) { return log.size(); }).get(),
            static_cast<std::size_t>(threads * per_thread));
  std::vector<int> next(threads, 0);
  std::size_t interleavings = 0;
  for (std::size_t k = 0; k < log.size(); ++k) {
    const auto [t, i] = log[k];
    ASSERT_EQ(i, next[t]) << "thread " << t << ": message " << i << " ran when " << next[t] << " was due";
    ++next[t];
    if (k > 0 && log[k - 1].first != t) ++interleavings;
  }
  for (int t = 0; t < threads; ++t) EXPECT_EQ(next[t], per_thread);
  std::printf("[ ordering ] %zu switches between threads in the run order\n", interleavings);
}

TEST(Ordering, MixedOperationsFromOneThreadRunInOrder) {
  runtime rt(quiet_options());
  compute_client c = rt.host();
  memory_handle h = c.create(16);
  std::vector<std::future<std::vector<std::byte>>> reads;
  for (int i = 0; i < 1000; ++i) {
    c.write(h.binding(), std::vector<std::byte>(16, static_cast<std::byte>(i & 0xff)), boost::asio::detached);
    reads.push_back(c.read(h.binding()));
  }
  for (int i = 0; i < 1000; ++i) {
    auto bytes = reads[static_cast<std::size_t>(i)].get();
    ASSERT_EQ(bytes, std::vector<std::byte>(16, static_cast<std::byte>(i & 0xff)))
        << "read " << i << " did not see the write posted just before it";
  }
}

TEST(Ordering, CreateThenGetResourceNeverSeesAnUnboundHandle) {
  runtime rt(quiet_options());
  compute_client c = rt.host();
  constexpr int total = 100'000;
  constexpr int batch = 1000;
  std::uint64_t failures = 0;
  boost::system::error_code first;
  for (int done = 0; done < total; done += batch) {
    std::vector<std::pair<std::uint64_t, std::future<devrt::memory::resource>>> futures;
    futures.reserve(batch);
    for (int i = 0; i < batch; ++i) {
      const std::uint64_t size = 1 + static_cast<std::uint64_t>((done + i) * 131 % 8192);
      memory_handle h = c.create(size);
      futures.emplace_back(size, c.get_resource(h.binding()));
      // The handle is dropped at once: the binding held by the queued get_resource keeps it.
    }
    for (auto& [size, f] : futures) {
      try {
        auto r = f.get();
        if (r.size != size || r.ptr == nullptr) ++failures;
      } catch (const boost::system::system_error& e) {
        if (!first) first = e.code();
        ++failures;
      }
    }
  }
  EXPECT_EQ(failures, 0u) << "first error: " << first.message();
  EXPECT_EQ(c.memory_usage().get().bytes_in_use, 0u);
  EXPECT_EQ(c.check_invariants().get(), "");
}

TEST(Ordering, CreateFromManyThreadsThenUseFromTheSameThread) {
  runtime rt(quiet_options());
  compute_client c = rt.host();
  std::atomic<int> failures{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < 4; ++t) {
    pool.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        memory_handle h = c.create(256);
        auto sz = c.submit({h.binding()}, [](submit_context& ctx) { return ctx.resources[0].size; });
        try {
          if (sz.get() != 256u) failures.fetch_add(1);
        } catch (const std::exception&) {
          failures.fetch_add(1);
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(Ordering, ABurstOfMessagesIsServedInFewDrains) {
  runtime rt(quiet_options());
  compute_client c = rt.host();
  const auto& actor = c.actor();
  ASSERT_EQ(actor->drains(), 0u);
  // The device thread is kept busy by a function of the caller's (submit runs on the device thread
  // only), so that the burst is queued rather than served in place on an idle actor.
  std::promise<void> gate;
  auto busy = c.submit({}, [opened = gate.get_future().share()](devrt::runtime::submit_context&) { opened.wait(); });
  ASSERT_TRUE(devrt_test::wait_until([&] { return actor->drains() >= 1; }));
  constexpr std::uint64_t burst = 10'000;
  std::vector<memory_handle> hs;
  hs.reserve(burst);
  for (std::uint64_t i = 0; i < burst; ++i) hs.push_back(c.create(64));
  EXPECT_EQ(actor->served_in_place(), 0u) << "a message was served in place while the device thread ran the actor";
  gate.set_value();
  busy.get();
  EXPECT_EQ(c.memory_usage().get().number_allocs, burst);
  ASSERT_TRUE(devrt_test::wait_until([&] { return actor->messages_processed() >= burst + 2; }));
  const std::uint64_t drains = actor->drains();
  const std::uint64_t processed = actor->messages_processed();
  std::printf("[ batching ] %llu messages in %llu drains\n", static_cast<unsigned long long>(processed),
              static_cast<unsigned long long>(drains));
  EXPECT_GE(processed, burst + 2);
  // One strand post per message would be 10,002 drains; batching takes many messages per drain.
  EXPECT_LT(drains, burst / 10) << "the mailbox does not batch";
  // A drain runs at most drain_budget messages before yielding.
  EXPECT_GE(drains, burst / devrt::runtime::device_actor::drain_budget);
}

}  // namespace
