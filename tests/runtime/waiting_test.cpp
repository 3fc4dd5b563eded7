// How clients and device threads wait: devrt's default future (polls, then blocks), the device
// thread's idle polling (`runtime_options::idle_spin`), and the mailbox's spin lock.

#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/use_future.hpp>
#include <boost/system/system_error.hpp>
#include <chrono>
#include <future>
#include <limits>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "devrt/runtime/runtime.hpp"
#include "devrt/runtime/spin.hpp"
#include "runtime_test_util.hpp"

namespace {

using devrt::errc;
using devrt::memory::memory_handle;
using devrt::runtime::runtime;
using devrt::runtime::runtime_options;
using devrt_test::quiet_options;

runtime_options with_spin(std::chrono::microseconds spin) {
  runtime_options o = quiet_options();
  o.idle_spin = spin;
  return o;
}

TEST(DefaultFuture, IsDevrtsFutureAndBehavesAsAStdFuture) {
  runtime rt(quiet_options());
  auto c = rt.host();
  auto f = c.reserve(4096);
  static_assert(std::is_same_v<decltype(f), devrt::runtime::future<memory_handle>>);
  static_assert(std::is_convertible_v<decltype(f), std::future<memory_handle>>);
  static_assert(!std::is_copy_constructible_v<decltype(f)>);
  ASSERT_TRUE(f.valid());
  f.wait();
  EXPECT_EQ(f.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  memory_handle h = f.get();
  EXPECT_FALSE(f.valid()) << "get() consumes the shared state, as std::future's does";
  EXPECT_TRUE(h.can_mut());

  // Converts to std::future by moving.
  std::future<memory_handle> g = c.reserve(4096);
  EXPECT_FALSE(g.get().empty());

  // A void operation.
  auto s = c.synchronize();
  static_assert(std::is_same_v<decltype(s), devrt::runtime::future<void>>);
  s.get();

  // Asio's own future is still available.
  auto a = c.reserve(4096, boost::asio::use_future);
  static_assert(std::is_same_v<decltype(a), std::future<memory_handle>>);
  EXPECT_FALSE(a.get().empty());
}

TEST(DefaultFuture, ErrorsThrowSystemErrorWithDevrtsCode) {
  runtime rt(quiet_options());
  auto c = rt.host();
  auto f = c.reserve(std::numeric_limits<std::uint64_t>::max());
  try {
    (void)f.get();
    ADD_FAILURE() << "a reserve above every pool must fail";
  } catch (const boost::system::system_error& e) {
    EXPECT_EQ(e.code(), errc::buffer_too_big);
    EXPECT_NE(std::string(e.what()).find("cannot allocate"), std::string::npos) << e.what();
  }
}

TEST(DefaultFuture, AnEmptyFutureReportsNoState) {
  devrt::runtime::future<memory_handle> f;
  EXPECT_FALSE(f.valid());
  try {
    (void)f.get();
    ADD_FAILURE() << "get() on an empty future must throw";
  } catch (const std::future_error& e) {
    EXPECT_EQ(e.code(), std::future_errc::no_state);
  }
}

// A slow operation: a submit that sleeps until `gate` opens.
template <class F>
auto slow_submit(devrt::runtime::compute_client& c, std::shared_future<void> gate, F&& fn) {
  return c.submit({}, [gate, fn = std::forward<F>(fn)](devrt::runtime::submit_context&) {
    gate.wait();
    return fn();
  });
}

TEST(DefaultFuture, WaitForAndWaitUntilTimeOutThenSeeTheResult) {
  runtime rt(quiet_options());
  auto c = rt.host();
  std::promise<void> open;
  auto f = slow_submit(c, open.get_future().share(), [] { return 41; });
  EXPECT_EQ(f.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout);
  EXPECT_EQ(f.wait_for(std::chrono::milliseconds(5)), std::future_status::timeout);
  EXPECT_EQ(f.wait_until(std::chrono::steady_clock::now() + std::chrono::milliseconds(5)), std::future_status::timeout);
  open.set_value();
  EXPECT_EQ(f.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_EQ(f.get(), 41);
}

TEST(DefaultFuture, ConvertsToStdFutureBeforeAndAfterTheResult) {
  runtime rt(quiet_options());
  auto c = rt.host();
  {
    // Converted while pending: the device thread hands the result to the std::future.
    std::promise<void> open;
    auto f = slow_submit(c, open.get_future().share(), [] { return 7; });
    std::future<int> g = std::move(f);
    EXPECT_FALSE(f.valid());  // NOLINT(bugprone-use-after-move): moved-from state is specified
    EXPECT_EQ(g.wait_for(std::chrono::milliseconds(5)), std::future_status::timeout);
    open.set_value();
    EXPECT_EQ(g.get(), 7);
  }
  {
    // Converted once ready.
    auto f = c.reserve(4096);
    f.wait();
    std::future<memory_handle> g = std::move(f);
    EXPECT_TRUE(g.get().can_mut());
  }
  {
    // An error travels through the conversion as system_error.
    std::future<memory_handle> g = c.reserve(std::numeric_limits<std::uint64_t>::max());
    try {
      (void)g.get();
      ADD_FAILURE() << "the reserve must fail";
    } catch (const boost::system::system_error& e) {
      EXPECT_EQ(e.code(), errc::buffer_too_big);
    }
  }
  {
    // Many pending conversions completed from the device thread while this thread converts.
    std::vector<std::future<memory_handle>> all;
    for (int i = 0; i < 2000; ++i) all.push_back(c.reserve(256));
    for (auto& g : all) EXPECT_FALSE(g.get().empty());
  }
}

TEST(DefaultFuture, AHandlerDroppedWithoutCompletingBreaksThePromise) {
  devrt::runtime::use_future_t token;
  auto f = boost::asio::async_initiate<devrt::runtime::use_future_t, void(boost::system::error_code, int)>(
      [](auto handler) { (void)handler; },  // dropped unanswered
      token);
  ASSERT_TRUE(f.valid());
  try {
    (void)f.get();
    ADD_FAILURE() << "get() must report the broken promise";
  } catch (const std::future_error& e) {
    EXPECT_EQ(e.code(), std::future_errc::broken_promise);
  }
}

TEST(DefaultFuture, AResultThatTakesLongerThanThePollingStillArrives) {
  runtime rt(with_spin(std::chrono::microseconds(0)));
  auto c = rt.host();
  auto f = c.submit({}, [](devrt::runtime::submit_context&) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // far beyond the future's polling
    return 7;
  });
  EXPECT_EQ(f.get(), 7);
}

// Requests a millisecond apart: a device thread that polls for longer serves them all in the drain
// it is in; one that sleeps when idle is not woken at all: each request finds the actor idle and is
// served in place by its caller.
struct spaced_requests {
  std::uint64_t drains;
  std::uint64_t in_place;
};

spaced_requests serve_spaced_requests(std::chrono::microseconds idle_spin, int requests) {
  runtime rt(with_spin(idle_spin));
  auto c = rt.host();
  // A function of the caller's runs on the device thread, which then polls for idle_spin.
  c.submit({}, [](devrt::runtime::submit_context&) {}).get();
  const auto drains = c.actor()->drains();
  const auto in_place = c.actor()->served_in_place();
  for (int i = 0; i < requests; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    (void)c.reserve(4096).get();
  }
  return {c.actor()->drains() - drains, c.actor()->served_in_place() - in_place};
}

TEST(IdleSpin, ADeviceThreadThatPollsServesSpacedRequestsWithoutNewDrains) {
  constexpr int requests = 40;
  const auto polling = serve_spaced_requests(std::chrono::milliseconds(500), requests);
  const auto sleeping = serve_spaced_requests(std::chrono::microseconds(0), requests);
  EXPECT_LE(polling.drains, 4u) << "the device thread stopped polling within its idle spin";
  EXPECT_LE(polling.in_place, 4u) << "requests were served in place while the device thread polled for them";
  EXPECT_GE(sleeping.in_place, static_cast<std::uint64_t>(requests) * 9 / 10)
      << "requests to an idle actor were not served by their callers";
  EXPECT_LE(sleeping.drains, 4u) << "a sleeping device thread was woken for requests its callers could serve";
}

TEST(IdleSpin, AShutdownEndsThePollingAtOnce) {
  runtime rt(with_spin(std::chrono::seconds(20)));
  auto c = rt.host();
  memory_handle h = c.reserve(4096).get();  // the device thread now polls for up to 20 s
  const auto start = std::chrono::steady_clock::now();
  rt.shutdown();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5)) << "the shutdown waited for the polling";
  EXPECT_EQ(devrt_test::failure_of(c.reserve(4096)).code, errc::shutdown);
}

TEST(IdleSpin, ManyThreadsWithPollingOnBothSidesKeepEveryRequest) {
  runtime rt(with_spin(std::chrono::milliseconds(1)));
  auto c = rt.host();
  constexpr int threads = 8;
  constexpr int per_thread = 500;
  std::atomic<int> served{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      std::vector<memory_handle> live;
      for (int i = 0; i < per_thread; ++i) {
        if (i % 2 == 0) {
          live.push_back(c.reserve(256 + i).get());
        } else {
          live.push_back(c.create(512 + i));
        }
        if (live.size() > 16) live.erase(live.begin());
        served.fetch_add(1);
      }
    });
  }
  for (auto& t : pool) t.join();
  EXPECT_EQ(served.load(), threads * per_thread);
  c.synchronize().get();
  EXPECT_EQ(c.check_invariants().get(), "");
  EXPECT_EQ(c.memory_usage().get().number_allocs, 0u);
}

TEST(SpinLock, ExcludesEveryOtherThread) {
  devrt::runtime::spin_lock lock;
  std::uint64_t counter = 0;  // not atomic: the lock alone protects it
  constexpr int threads = 8;
  constexpr int per_thread = 20000;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (int i = 0; i < per_thread; ++i) {
        std::lock_guard guard(lock);
        ++counter;
      }
    });
  }
  for (auto& t : pool) t.join();
  EXPECT_EQ(counter, std::uint64_t{threads} * per_thread);
}

TEST(SpinUntil, ReturnsTrueOnceReadyAndFalseAfterTheLimit) {
  int calls = 0;
  EXPECT_TRUE(devrt::runtime::detail::spin_until([&] { return ++calls == 100; }, std::chrono::seconds(10)));
  EXPECT_EQ(calls, 100);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(devrt::runtime::detail::spin_until([] { return false; }, std::chrono::microseconds(200)));
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::microseconds(200));
}

}  // namespace
