// Edges of the client found from outside: errors that must keep their values however many came
// before, a blocking wait on the device's own thread, a default-constructed client, a failed bind
// and the argument order of get_resource.
#include <gtest/gtest.h>

#include <boost/asio/use_future.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <string>
#include <vector>

#include "devrt/runtime/runtime.hpp"
#include "runtime_test_util.hpp"

namespace {

using devrt::errc;
using devrt::memory::memory_binding;
using devrt::memory::memory_handle;
using devrt::runtime::compute_client;
using devrt::runtime::runtime;
using devrt::runtime::submit_context;
using devrt_test::failure_of;
using devrt_test::quiet_options;

constexpr std::uint64_t mib = 1ULL << 20;
constexpr std::uint64_t gib = 1ULL << 30;
constexpr std::uint64_t pib = 1ULL << 50;

bool contains(const std::string& s, const std::string& n) { return s.find(n) != std::string::npos; }

/// Waits for `f` at most `limit`; a device that hangs cannot be shut down, so the test binary is
/// stopped rather than left hanging.
template <class Future>
void require_completes(Future& f, std::chrono::seconds limit, const char* what) {
  if (f.wait_for(limit) == std::future_status::ready) return;
  std::fprintf(stderr, "%s did not complete within %lld s: the device hangs\n", what,
               static_cast<long long>(limit.count()));
  std::fflush(stderr);
  std::abort();
}

class Edges : public ::testing::Test {
 protected:
  runtime rt{quiet_options()};
  compute_client c = rt.host();
};

// ---- Errors keep their values ----

TEST_F(Edges, ThousandsOfErrorsLaterAnErrorStillCarriesItsValues) {
  // Distinct messages: each size differs.
  for (std::uint64_t i = 0; i < 5000; ++i) {
    auto f = failure_of(c.reserve(2 * gib + i));
    ASSERT_EQ(f.code, errc::buffer_too_big) << f.what;
  }
  const std::uint64_t size = pib + 123457;
  auto f = c.reserve(size);
  try {
    (void)f.get();
    FAIL() << "a 1 PiB reserve succeeded";
  } catch (const devrt::runtime::system_error& e) {
    EXPECT_EQ(e.code(), errc::buffer_too_big);
    EXPECT_EQ(e.err().size, size);
    EXPECT_EQ(e.err().limit, gib) << "the largest pool of sub-slices on the host takes 1 GiB";
    EXPECT_TRUE(contains(e.what(), std::to_string(size))) << e.what();
    EXPECT_TRUE(contains(e.what(), std::to_string(gib))) << e.what();
    EXPECT_FALSE(contains(e.what(), "cannot allocate 0 bytes")) << e.what();
  } catch (const boost::system::system_error& e) {
    ADD_FAILURE() << "threw a system_error without the devrt error: " << e.what();
  }
  // The code alone names the kind and claims no values.
  auto g = failure_of(c.reserve(size, boost::asio::use_future));
  EXPECT_EQ(g.code, errc::buffer_too_big);
  EXPECT_FALSE(contains(g.code.message(), " 0 bytes")) << g.code.message();
  EXPECT_TRUE(contains(g.code.message(), "buffer_too_big")) << g.code.message();
}

TEST_F(Edges, ThousandsOfFailedCreatesLaterTheFirstStillReportsItsError) {
  const std::uint64_t first_size = pib + 777;
  memory_handle first = c.create(first_size);
  std::vector<memory_handle> later;
  for (std::uint64_t i = 0; i < 2100; ++i) {
    later.push_back(c.create(3 * gib + i));
    if (later.size() > 64) later.erase(later.begin());  // dropped ones free their remembered error
  }
  auto f = c.get_resource(first.binding());
  try {
    (void)f.get();
    FAIL() << "a failed create resolved";
  } catch (const devrt::runtime::system_error& e) {
    EXPECT_EQ(e.code(), errc::buffer_too_big) << e.what();
    EXPECT_EQ(e.err().size, first_size);
    EXPECT_TRUE(contains(e.what(), std::to_string(first_size))) << e.what();
  }
  // The latest too.
  auto last = failure_of(c.read(later.back().binding()));
  EXPECT_EQ(last.code, errc::buffer_too_big) << last.what;
  EXPECT_TRUE(contains(last.what, std::to_string(3 * gib + 2099))) << last.what;
  // A handle that was never given to create stays a plain not_found.
  EXPECT_EQ(failure_of(c.get_resource(memory_handle::make().binding())).code, errc::not_found);
  EXPECT_EQ(c.check_invariants().get(), "");
}

// ---- Blocking on the device thread ----

TEST_F(Edges, WaitingInsideSubmitForTheSameDeviceFailsInsteadOfHanging) {
  auto f = c.submit({}, [this](submit_context&) { return c.reserve(64).get(); });
  require_completes(f, std::chrono::seconds(20), "a submit that waits for a reserve of its own device");
  auto fail = failure_of(f);
  EXPECT_FALSE(fail.threw_other) << fail.other;
  EXPECT_EQ(fail.code, errc::task_failed) << fail.what;
  EXPECT_TRUE(contains(fail.what, "would deadlock")) << fail.what;
  EXPECT_TRUE(contains(fail.what, "device's own thread")) << fail.what;

  // wait() throws the same; a timed wait reports a timeout at once.
  auto w = c.submit({}, [this](submit_context&) {
    auto r = c.reserve(64);
    const auto start = std::chrono::steady_clock::now();
    const bool timed_out = r.wait_for(std::chrono::seconds(5)) == std::future_status::timeout;
    const bool quick = std::chrono::steady_clock::now() - start < std::chrono::seconds(2);
    bool threw = false;
    try {
      r.wait();
    } catch (const devrt::runtime::system_error& e) {
      threw = e.code() == errc::would_deadlock;
    }
    return timed_out && quick && threw;
  });
  require_completes(w, std::chrono::seconds(20), "a submit that waits with a timeout");
  EXPECT_TRUE(w.get());

  // The device keeps serving, and the reserves posted from inside completed too.
  memory_handle h = c.reserve(4096).get();
  EXPECT_EQ(c.get_resource(h.binding()).get().size, 4096u);
  EXPECT_EQ(c.check_invariants().get(), "");
}

TEST_F(Edges, WaitingInsideSubmitForAnotherDeviceIsAllowed) {
  auto opts = quiet_options();
  opts.sim = devrt::devices::sim_options{};
  runtime two(opts);
  compute_client host = two.host();
  compute_client sim = two.sim();
  auto f = host.submit({}, [&sim](submit_context&) { return sim.reserve(64).get().id().value != 0; });
  require_completes(f, std::chrono::seconds(20), "a submit that waits for another device");
  EXPECT_TRUE(f.get());
}

// ---- A default-constructed client ----

template <class F>
void expect_no_device(F&& f, const char* what) {
  try {
    f();
    ADD_FAILURE() << what << ": no exception";
  } catch (const devrt::exception& e) {
    EXPECT_EQ(e.code(), errc::invalid_argument) << what << ": " << e.what();
    EXPECT_TRUE(contains(e.what(), "refers to no device")) << what << ": " << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": threw " << e.what();
  }
}

TEST(DefaultClient, EveryMemberFailsWithAClearError) {
  const compute_client none;
  EXPECT_FALSE(none.valid());
  EXPECT_EQ(none.actor(), nullptr);
  const memory_binding b;
  expect_no_device([&] { (void)none.device(); }, "device");
  expect_no_device([&] { (void)none.reserve(64); }, "reserve");
  expect_no_device([&] { (void)none.reserve(64, [](devrt::runtime::error_code, memory_handle) {}); }, "reserve cb");
  expect_no_device([&] { (void)none.create(64); }, "create");
  expect_no_device([&] { (void)none.bind(memory_handle::make(), memory_handle::make()); }, "bind");
  expect_no_device([&] { (void)none.get_resource(b); }, "get_resource");
  expect_no_device([&] { (void)none.get_resource(b, 1, 2); }, "get_resource with offsets");
  expect_no_device([&] { (void)none.write(b, std::vector<std::byte>(4)); }, "write");
  expect_no_device([&] { (void)none.read(b); }, "read");
  expect_no_device([&] { (void)none.submit({}, [](submit_context&) {}); }, "submit");
  expect_no_device([&] { (void)none.cleanup(); }, "cleanup");
  expect_no_device([&] { (void)none.configure(devrt::memory::preset::sub_slices); }, "configure");
  expect_no_device([&] { (void)none.memory_usage(); }, "memory_usage");
  expect_no_device([&] { (void)none.statistics(); }, "statistics");
  expect_no_device([&] { (void)none.report(); }, "report");
  expect_no_device([&] { (void)none.check_invariants(); }, "check_invariants");
  expect_no_device([&] { (void)none.capture_begin(); }, "capture_begin");
  expect_no_device([&] { (void)none.capture_end(); }, "capture_end");
  expect_no_device([&] { (void)none.replay(devrt::runtime::device_graph{}); }, "replay");
  expect_no_device([&] { (void)none.synchronize(); }, "synchronize");
  expect_no_device([&] { auto s = none.persistent(); }, "persistent");
  expect_no_device(
      [&] {
        (void)none.async_run<int>([](devrt::runtime::actor_core&) { return devrt::result<int>(1); },
                                  devrt::runtime::use_future);
      },
      "async_run");
  expect_no_device([&] { (void)none.async_fail<int>(devrt::error::make(errc::not_found), devrt::runtime::use_future); },
                   "async_fail");
}

// ---- bind keeps the reserved handle on failure ----

TEST_F(Edges, AFailedBindLeavesTheReservedMemoryWithTheCaller) {
  memory_handle reserved = c.reserve(4096).get();
  memory_handle taken = c.reserve(64).get();                // has memory already: binding to it fails
  auto f = failure_of(c.bind(std::move(reserved), taken));  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(f.code, errc::already_bound) << f.what;
  ASSERT_FALSE(reserved.empty()) << "a failed bind consumed the reserved handle";  // NOLINT
  EXPECT_EQ(c.get_resource(reserved.binding()).get().size, 4096u);
  EXPECT_EQ(c.memory_usage().get().number_allocs, 2u);

  // Once bound, the caller's handle is stale and the memory belongs to the new identity.
  memory_handle fresh = memory_handle::make();
  c.bind(reserved, fresh).get();
  EXPECT_EQ(failure_of(c.get_resource(reserved.binding())).code, errc::not_found);
  EXPECT_EQ(c.get_resource(fresh.binding()).get().size, 4096u);
  reserved.reset();
  EXPECT_EQ(c.memory_usage().get().number_allocs, 2u);
  EXPECT_EQ(c.check_invariants().get(), "");
}

// ---- get_resource: the token comes last ----

TEST_F(Edges, GetResourceTakesTheTokenLast) {
  memory_handle h = c.reserve(1024).get();
  const auto full = c.get_resource(h.binding()).get();
  std::promise<devrt::memory::resource> p;
  c.get_resource(h.binding(), 100, 200, [&p](devrt::runtime::error_code ec, devrt::memory::resource r) {
    EXPECT_FALSE(ec) << ec.message();
    p.set_value(r);
  });
  auto fut = p.get_future();
  ASSERT_EQ(fut.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  const auto view = fut.get();
  EXPECT_EQ(view.ptr, static_cast<std::byte*>(full.ptr) + 100);
  EXPECT_EQ(view.size, 1024u - 300);
  EXPECT_EQ(c.get_resource(h.binding(), boost::asio::use_future).get().size, 1024u);
  EXPECT_EQ(c.get_resource(h.binding(), 1000).get().size, 24u);
  EXPECT_EQ(c.get_resource(h.binding(), std::nullopt, 24, boost::asio::use_future).get().size, 1000u);
  (void)mib;
}

}  // namespace
