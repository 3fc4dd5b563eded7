// Every error reaches the caller in each completion style: use_future (system_error carrying the
// full devrt message), callbacks (ec == devrt::errc::x, never inline, never on the caller's
// thread), C++20 coroutines with use_awaitable (system_error) and as_tuple(use_awaitable) (the ec,
// no throw). Covers allocation errors, handle errors, configuration and capture errors, out of
// memory with its one reclaim, and shutdown.

#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "devrt/runtime/runtime.hpp"
#include "runtime_test_util.hpp"

namespace {

namespace asio = boost::asio;
using boost::system::error_code;
using devrt::errc;
using devrt::devices::sim_options;
using devrt::memory::exclusive_pool_config;
using devrt::memory::memory_binding;
using devrt::memory::memory_handle;
using devrt::memory::pool_config;
using devrt::memory::preset;
using devrt::memory::sliced_pool_config;
using devrt::runtime::compute_client;
using devrt::runtime::runtime;
using devrt::runtime::runtime_options;
using devrt::runtime::submit_context;
using devrt_test::failure_of;
using devrt_test::quiet_options;

constexpr std::uint64_t kib = 1ULL << 10;
constexpr std::uint64_t mib = 1ULL << 20;
constexpr std::uint64_t gib = 1ULL << 30;

bool contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

/// Runs `op(token)` through devrt's future, Asio's std::future, a callback, a coroutine
/// (use_awaitable) and as_tuple(use_awaitable), and checks that each completes with `expected`.
/// The error's values (every needle) reach the caller in devrt's future's exception, which holds
/// the devrt::error; the other tokens get the code, whose message names the kind (see error.hpp).
template <class Op>
void expect_error_in_every_style(Op op, errc expected, const std::vector<std::string>& needles) {
  // 1. devrt's future: get() throws devrt::runtime::system_error with the code, the error and its
  //    full message in what().
  {
    SCOPED_TRACE("devrt::runtime::use_future");
    auto f = op(devrt::runtime::use_future);
    try {
      (void)f.get();
      ADD_FAILURE() << "no exception";
    } catch (const devrt::runtime::system_error& e) {
      EXPECT_EQ(e.code(), expected) << e.what();
      EXPECT_EQ(e.code().category().name(), std::string("devrt"));
      EXPECT_EQ(e.err().code, expected);
      EXPECT_EQ(std::string(e.what()), e.err().message());
      for (const auto& n : needles) EXPECT_TRUE(contains(e.what(), n)) << "what() lacks '" << n << "': " << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "a devrt future must throw devrt::runtime::system_error, got: " << e.what();
    }
  }
  // 2. Asio's use_future: get() throws boost::system::system_error with the code.
  {
    SCOPED_TRACE("asio::use_future");
    auto f = failure_of(op(asio::use_future));
    EXPECT_FALSE(f.threw_other) << "a future must throw boost::system::system_error, got: " << f.other;
    EXPECT_EQ(f.code, expected) << f.code.message();
    EXPECT_EQ(f.code.category().name(), std::string("devrt"));
    EXPECT_EQ(devrt::runtime::to_errc(f.code), expected);
    EXPECT_TRUE(contains(f.code.message(), devrt::to_string(expected))) << f.code.message();
  }
  // 3. A callback: gets the code, on a thread other than the caller's.
  {
    SCOPED_TRACE("callback");
    std::promise<std::pair<error_code, std::thread::id>> p;
    auto fut = p.get_future();
    op([&p](error_code ec, auto&&...) { p.set_value({ec, std::this_thread::get_id()}); });
    ASSERT_EQ(fut.wait_for(std::chrono::seconds(30)), std::future_status::ready) << "the callback never ran";
    auto [ec, thread] = fut.get();
    EXPECT_EQ(ec, expected) << ec.message();
    EXPECT_NE(thread, std::this_thread::get_id()) << "a callback must not run inline on the caller's thread";
  }
  // 4. A coroutine with use_awaitable: the co_await throws system_error.
  {
    SCOPED_TRACE("use_awaitable");
    asio::io_context io;
    bool threw = false;
    bool finished = false;
    error_code caught;
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          try {
            co_await op(asio::use_awaitable);
          } catch (const boost::system::system_error& e) {
            threw = true;
            caught = e.code();
          }
          finished = true;
        },
        asio::detached);
    io.run();
    EXPECT_TRUE(finished);
    EXPECT_TRUE(threw) << "the awaited operation did not throw";
    EXPECT_EQ(caught, expected) << caught.message();
  }
  // 5. as_tuple(use_awaitable): the code comes back without an exception.
  {
    SCOPED_TRACE("as_tuple(use_awaitable)");
    asio::io_context io;
    bool finished = false;
    error_code got;
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          auto t = co_await op(asio::as_tuple(asio::use_awaitable));
          got = std::get<0>(t);
          finished = true;
        },
        asio::detached);
    io.run();
    EXPECT_TRUE(finished);
    EXPECT_EQ(got, expected) << got.message();
  }
}

class Errors : public ::testing::Test {
 protected:
  runtime rt{quiet_options()};
  compute_client c = rt.host();
};

TEST_F(Errors, BufferTooBig) {
  // The host's largest pool takes 1 GiB; 2 GiB fits no pool.
  expect_error_in_every_style([&](auto&& token) { return c.reserve(2 * gib, std::forward<decltype(token)>(token)); },
                              errc::buffer_too_big, {"2147483648", "no pool of the layout accepts", "1073741824"});
  // Larger than any device: refused before the pools are asked.
  expect_error_in_every_style(
      [&](auto&& token) { return c.reserve(std::uint64_t{1} << 63, std::forward<decltype(token)>(token)); },
      errc::buffer_too_big, {"9223372036854775808"});
  EXPECT_EQ(c.statistics().get().failed_reserves, 10u);  // five styles, two sizes
  EXPECT_EQ(c.memory_usage().get().bytes_reserved, 0u) << "nothing was allocated";
}

TEST(ErrorsCapped, PoolCapacityExceeded) {
  runtime_options o = quiet_options();
  o.host_layout = std::vector<pool_config>{sliced_pool_config{mib, mib, 2 * mib}};
  runtime rt(o);
  compute_client c = rt.host();
  memory_handle a = c.reserve(mib).get();
  memory_handle b = c.reserve(mib).get();
  expect_error_in_every_style([&](auto&& token) { return c.reserve(mib, std::forward<decltype(token)>(token)); },
                              errc::pool_capacity_exceeded, {"1048576", "2097152", "capped"});
  // Transient: freeing memory makes the same reserve succeed.
  a.reset();
  EXPECT_EQ(c.reserve(mib).get().raw() != nullptr, true);
  // A size the capped pool does not accept is buffer_too_big, not a capacity error.
  EXPECT_EQ(failure_of(c.reserve(2 * mib)).code, errc::buffer_too_big);
}

TEST_F(Errors, NotFoundForAStaleHandleAfterBind) {
  memory_handle reserved = c.reserve(4096).get();
  memory_handle stale = reserved;
  memory_handle assigned = memory_handle::make();
  c.bind(std::move(reserved), assigned).get();
  expect_error_in_every_style(
      [&](auto&& token) { return c.get_resource(stale.binding(), std::forward<decltype(token)>(token)); },
      errc::not_found, {"memory not found", "stale"});
  // The other operations on the stale handle fail the same way.
  EXPECT_EQ(failure_of(c.read(stale.binding())).code, errc::not_found);
  EXPECT_EQ(failure_of(c.write(stale.binding(), std::vector<std::byte>(8))).code, errc::not_found);
  EXPECT_EQ(failure_of(c.bind(stale, memory_handle::make())).code, errc::not_found);
  EXPECT_EQ(c.get_resource(assigned.binding()).get().size, 4096u);
}

TEST_F(Errors, NotFoundForAnEmptyOrUnboundHandle) {
  expect_error_in_every_style(
      [&](auto&& token) { return c.get_resource(memory_binding{}, std::forward<decltype(token)>(token)); },
      errc::not_found, {"the handle is empty"});
  memory_handle fresh = memory_handle::make();
  expect_error_in_every_style(
      [&](auto&& token) { return c.get_resource(fresh.binding(), std::forward<decltype(token)>(token)); },
      errc::not_found, {"never initialized"});
}

TEST_F(Errors, AlreadyBound) {
  memory_handle first = c.reserve(64).get();
  memory_handle target = memory_handle::make();
  c.bind(std::move(first), target).get();
  std::vector<memory_handle> spares;  // one per completion style
  for (int i = 0; i < 5; ++i) spares.push_back(c.reserve(64).get());
  int next = 0;
  expect_error_in_every_style(
      [&](auto&& token) { return c.bind(spares[next++], target, std::forward<decltype(token)>(token)); },
      errc::already_bound, {"already has memory"});
  // Binding a handle to itself is refused too.
  EXPECT_EQ(failure_of(c.bind(target, target)).code, errc::already_bound);
  EXPECT_EQ(c.check_invariants().get(), "");
}

TEST_F(Errors, InvalidConfiguration) {
  const std::vector<pool_config> bad{sliced_pool_config{mib, 4 * mib}};
  expect_error_in_every_style(
      [&](auto&& token) { return c.configure(bad, std::forward<decltype(token)>(token)); },
      errc::slice_larger_than_page,
      {"invalid layout (pool 0)", "max_slice_size (4194304 bytes)", "page_size (1048576 bytes)"});
  const std::vector<pool_config> too_many_pages{sliced_pool_config{64 * kib, std::nullopt, 8 * gib}};
  expect_error_in_every_style(
      [&](auto&& token) { return c.configure(too_many_pages, std::forward<decltype(token)>(token)); },
      errc::too_many_pages, {"131072 pages"});
  EXPECT_EQ(c.actor()->messages_processed(), 0u) << "invalid layouts are refused on the caller's side";
}

TEST_F(Errors, NoCapture) {
  expect_error_in_every_style([&](auto&& token) { return c.capture_end(std::forward<decltype(token)>(token)); },
                              errc::no_capture, {"no capture window is open"});
}

TEST_F(Errors, CaptureActiveRefusesConfigure) {
  c.capture_begin().get();
  expect_error_in_every_style(
      [&](auto&& token) { return c.configure(preset::exclusive_pages, std::forward<decltype(token)>(token)); },
      errc::capture_active, {"not allowed during a capture", "capture window is open"});
  auto graph = c.capture_end().get();
  EXPECT_TRUE(c.configure(preset::exclusive_pages).get().applied);
}

TEST_F(Errors, SubmitFailureInEveryStyle) {
  expect_error_in_every_style(
      [&](auto&& token) {
        return c.submit(
            {}, [](submit_context&) -> int { throw std::runtime_error("kernel exploded at step 12"); },
            std::forward<decltype(token)>(token));
      },
      errc::task_failed, {"kernel exploded at step 12"});
}

// ---- Callbacks never run inline ----

TEST_F(Errors, CallbackRunsAfterReserveReturnsAndOffTheCallersThread) {
  // Hold the strand so that the reserve cannot be served before reserve() returns.
  std::promise<void> gate;
  std::shared_future<void> open = gate.get_future().share();
  auto blocker = c.submit({}, [open](submit_context&) { open.wait(); });
  std::atomic<bool> called{false};
  std::atomic<bool> off_thread{false};
  const auto caller = std::this_thread::get_id();
  std::promise<error_code> done;
  c.reserve(2 * gib, [&](error_code ec, memory_handle h) {
    called = true;
    off_thread = std::this_thread::get_id() != caller;
    EXPECT_TRUE(h.empty());
    done.set_value(ec);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(called.load()) << "the callback ran before the strand served the request";
  gate.set_value();
  auto f = done.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_EQ(f.get(), errc::buffer_too_big);
  EXPECT_TRUE(off_thread.load());
  blocker.get();
}

TEST_F(Errors, CallerSideFailureCompletesOffTheCallersThread) {
  const auto caller = std::this_thread::get_id();
  std::promise<std::thread::id> where;
  bool returned = false;
  std::atomic<bool> saw_returned{false};
  std::mutex m;
  {
    std::lock_guard lock(m);  // the callback cannot finish before configure() has returned
    c.configure(std::vector<pool_config>{}, [&](error_code ec, devrt::memory::configure_outcome) {
      EXPECT_EQ(ec, errc::empty_pool_list);
      {
        std::lock_guard inner(m);
        saw_returned = returned;
      }
      // Outside the lock: once the value is set the test may return and destroy the mutex.
      where.set_value(std::this_thread::get_id());
    });
    returned = true;
  }
  auto f = where.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_NE(f.get(), caller);
  EXPECT_TRUE(saw_returned.load());
}

TEST_F(Errors, SuccessfulCallbacksAndCoroutinesToo) {
  std::promise<std::pair<error_code, std::uint64_t>> p;
  c.reserve(1000, [&](error_code ec, memory_handle h) { p.set_value({ec, h.use_count()}); });
  auto [ec, uses] = p.get_future().get();
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_EQ(uses, 1u);

  asio::io_context io;
  std::uint64_t size = 0;
  std::thread::id completed_on;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        memory_handle h = co_await c.reserve(777, asio::use_awaitable);
        auto r = co_await c.get_resource(h.binding(), asio::use_awaitable);
        size = r.size;
        completed_on = std::this_thread::get_id();
        // The bindings are built outside the co_await: GCC 12 rejects a braced initializer list
        // inside a co_await expression.
        std::vector<memory_binding> bs;
        bs.push_back(h.binding());
        auto t = co_await c.submit(
            std::move(bs), [](submit_context& ctx) { return ctx.resources[0].size; },
            asio::as_tuple(asio::use_awaitable));
        EXPECT_FALSE(std::get<0>(t));
        EXPECT_EQ(std::get<1>(t), 777u);
      },
      asio::detached);
  io.run();
  EXPECT_EQ(size, 777u);
  EXPECT_EQ(completed_on, std::this_thread::get_id()) << "a coroutine resumes on its own executor";
  EXPECT_EQ(c.memory_usage().get().bytes_in_use, 0u);
}

// ---- Out of memory and the one reclaim ----

runtime_options small_sim() {
  runtime_options o = quiet_options();
  sim_options s;
  s.props = {mib, 512, 4 * mib};  // pages up to 1 MiB, 512-byte alignment, 4 MiB of device memory
  o.sim = s;
  // Exclusive pools without a deallocation period: freed pages stay cached until a cleanup.
  o.sim_layout = std::vector<pool_config>{exclusive_pool_config{256 * kib}, exclusive_pool_config{mib}};
  return o;
}

TEST(ErrorsOutOfMemory, ReclaimThenRetrySucceedsOnceCachedPagesAreFreed) {
  runtime rt(small_sim());
  compute_client c = rt.sim();
  EXPECT_EQ(c.device().properties.capacity, 4 * mib);
  std::vector<memory_handle> small;
  for (int i = 0; i < 16; ++i) small.push_back(c.reserve(256 * kib).get());
  EXPECT_EQ(c.memory_usage().get().bytes_reserved, 4 * mib) << "the device is full";
  for (int i = 0; i < 16; i += 2) small[i].reset();
  auto u = c.memory_usage().get();
  EXPECT_EQ(u.bytes_in_use, 2 * mib);
  EXPECT_EQ(u.bytes_reserved, 4 * mib) << "freed pages are cached, still held from the device";
  EXPECT_EQ(c.statistics().get().reclaims, 0u);

  // 1 MiB fits only once the cached pages go back to the device: the actor reclaims and retries.
  memory_handle big = c.reserve(mib).get();
  ASSERT_FALSE(big.empty());
  auto s = c.statistics().get();
  EXPECT_EQ(s.reclaims, 1u);
  EXPECT_GE(s.out_of_memory, 1u);
  u = c.memory_usage().get();
  EXPECT_EQ(u.bytes_in_use, 3 * mib);
  EXPECT_EQ(u.bytes_reserved, 3 * mib);

  memory_handle last = c.reserve(mib).get();  // exactly fills the device
  EXPECT_EQ(c.statistics().get().reclaims, 1u) << "no reclaim when the device has room";

  // Nothing left to reclaim: out of memory, with the sizes in the message.
  expect_error_in_every_style([&](auto&& token) { return c.reserve(mib, std::forward<decltype(token)>(token)); },
                              errc::out_of_memory,
                              {"out of device memory", "refused 1048576 bytes", "capacity 4194304"});
  s = c.statistics().get();
  EXPECT_EQ(s.reclaims, 6u) << "one reclaim per failing reserve";
  EXPECT_EQ(c.check_invariants().get(), "");

  // The manager stays consistent: freeing memory makes the reserve work again.
  big.reset();
  EXPECT_FALSE(c.reserve(mib).get().empty());
  EXPECT_EQ(c.check_invariants().get(), "");
}

TEST(ErrorsOutOfMemory, AFailedCreateReportsItsOutOfMemoryLater) {
  runtime rt(small_sim());
  compute_client c = rt.sim();
  std::vector<memory_handle> full;
  for (int i = 0; i < 4; ++i) full.push_back(c.create(mib));
  memory_handle failed = c.create(mib);  // returns at once; the reserve fails on the strand
  ASSERT_FALSE(failed.empty());
  for (const auto& h : full) EXPECT_EQ(c.get_resource(h.binding()).get().size, mib);
  expect_error_in_every_style(
      [&](auto&& token) { return c.get_resource(failed.binding(), std::forward<decltype(token)>(token)); },
      errc::out_of_memory, {"out of device memory", "1048576", "capacity 4194304"});
  // Every operation that resolves the handle explains the failure the same way.
  EXPECT_EQ(failure_of(c.submit({failed.binding()}, [](submit_context&) {})).code, errc::out_of_memory);
  EXPECT_EQ(failure_of(c.read(failed.binding())).code, errc::out_of_memory);
  // A plain not_found (a handle that was never created) stays not_found.
  EXPECT_EQ(failure_of(c.get_resource(memory_handle::make().binding())).code, errc::not_found);
  EXPECT_EQ(c.check_invariants().get(), "");
}

// ---- Shutdown ----

TEST(ErrorsShutdown, OperationsAfterShutdownCompleteWithShutdownInEveryStyle) {
  runtime rt(quiet_options());
  compute_client c = rt.host();
  memory_handle survivor = c.reserve(1000).get();
  memory_handle created = c.create(2000);
  rt.shutdown();
  expect_error_in_every_style([&](auto&& token) { return c.reserve(64, std::forward<decltype(token)>(token)); },
                              errc::shutdown, {"shut down"});
  expect_error_in_every_style(
      [&](auto&& token) { return c.get_resource(survivor.binding(), std::forward<decltype(token)>(token)); },
      errc::shutdown, {"shut down"});
  expect_error_in_every_style([&](auto&& token) { return c.memory_usage(std::forward<decltype(token)>(token)); },
                              errc::shutdown, {"shut down"});
  expect_error_in_every_style(
      [&](auto&& token) {
        return c.submit(
            {}, [](submit_context&) { return 1; }, std::forward<decltype(token)>(token));
      },
      errc::shutdown, {"shut down"});
  // create still returns a handle; using it reports the shutdown.
  memory_handle late = c.create(10);
  EXPECT_FALSE(late.empty());
  EXPECT_EQ(failure_of(c.get_resource(late.binding())).code, errc::shutdown);
  {
    auto scope = c.persistent();  // posts to a closed mailbox: harmless
  }
  rt.shutdown();  // idempotent
  // Handles that outlive the actor's memory can be copied and dropped.
  memory_handle copy = survivor;
  survivor.reset();
  copy.reset();
  created.reset();
  late.reset();
}

TEST(ErrorsShutdown, ClientsThatOutliveTheRuntime) {
  auto rt = std::make_unique<runtime>(quiet_options());
  compute_client c = rt->host();
  memory_handle h = c.reserve(4096).get();
  memory_binding b = h.binding();
  rt.reset();
  auto f = failure_of(c.reserve(64));
  EXPECT_EQ(f.code, errc::shutdown) << f.what << f.other;
  std::promise<error_code> p;
  c.cleanup([&p](error_code ec) { p.set_value(ec); });
  auto fut = p.get_future();
  ASSERT_EQ(fut.wait_for(std::chrono::seconds(30)), std::future_status::ready) << "callback after the runtime is gone";
  EXPECT_EQ(fut.get(), errc::shutdown);
  memory_handle copy = h;
  h.reset();
  b.reset();
  copy.reset();
}

TEST(ErrorsShutdown, RequestsQueuedAtShutdownCompleteWithShutdown) {
  runtime rt(quiet_options());
  compute_client c = rt.host();
  std::promise<void> gate;
  std::shared_future<void> open = gate.get_future().share();
  std::atomic<bool> blocker_running{false};
  auto blocker = c.submit({}, [open, &blocker_running](submit_context&) {
    blocker_running = true;
    open.wait();
    return 5;
  });
  ASSERT_TRUE(devrt_test::wait_until([&] { return blocker_running.load(); }));
  std::vector<std::future<memory_handle>> queued;
  for (int i = 0; i < 100; ++i) queued.push_back(c.reserve(1000));
  std::thread stopper([&] { rt.shutdown(); });
  // Open the gate only once the stopper has closed the mailbox, not after a guessed delay: while
  // the strand is blocked, nothing but the close can complete a request, so a probe that completes
  // proves the queued reserves were answered with shutdown.
  auto probe = c.memory_usage();
  ASSERT_EQ(probe.wait_for(std::chrono::seconds(60)), std::future_status::ready) << "the mailbox never closed";
  EXPECT_EQ(failure_of(probe).code, errc::shutdown);
  gate.set_value();
  stopper.join();
  EXPECT_EQ(blocker.get(), 5) << "the request being served finishes";
  for (auto& f : queued) {
    auto fail = failure_of(f);
    EXPECT_FALSE(fail.threw_other) << "never a broken promise: " << fail.other;
    EXPECT_EQ(fail.code, errc::shutdown) << fail.code.message();
  }
}

}  // namespace
