// The compute client's operations through futures: reserve, create, bind, get_resource, write/read,
// submit, cleanup, configure, usage/statistics/report, capture, persistent scopes, invariants.

#include <gtest/gtest.h>

#include <boost/asio/use_future.hpp>
#include <cstring>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "devrt/runtime/runtime.hpp"
#include "runtime_test_util.hpp"

namespace {

using devrt::errc;
using devrt::memory::exclusive_pool_config;
using devrt::memory::memory_binding;
using devrt::memory::memory_handle;
using devrt::memory::memory_layout;
using devrt::memory::pool_config;
using devrt::memory::preset;
using devrt::memory::sliced_pool_config;
using devrt::runtime::compute_client;
using devrt::runtime::device_kind;
using devrt::runtime::runtime;
using devrt::runtime::submit_context;
using devrt_test::failure_of;
using devrt_test::pattern;
using devrt_test::quiet_options;

constexpr std::uint64_t mib = 1ULL << 20;

class Client : public ::testing::Test {
 protected:
  runtime rt{quiet_options()};
  compute_client c = rt.host();
};

TEST_F(Client, DeviceAndValidity) {
  EXPECT_TRUE(c.valid());
  EXPECT_EQ(c.device().name, "host");
  EXPECT_EQ(c.device().kind, device_kind::host);
  EXPECT_EQ(c.device().properties.alignment, 64u);
  compute_client empty;
  EXPECT_FALSE(empty.valid());
  compute_client copy = c;
  EXPECT_EQ(copy.actor(), c.actor());
  ASSERT_EQ(rt.devices().size(), 1u);
  EXPECT_EQ(rt.devices()[0].name, "host");
  try {
    (void)rt.sim();
    ADD_FAILURE() << "no sim device was configured, yet sim() returned a client";
  } catch (const devrt::exception& e) {
    EXPECT_EQ(e.code(), errc::not_found);
    EXPECT_EQ(e.err().text, "sim:0");
    EXPECT_NE(std::string(e.what()).find("no device of that kind"), std::string::npos) << e.what();
  }
}

TEST_F(Client, ReserveGivesAUniqueHandle) {
  memory_handle h = c.reserve(1000).get();
  ASSERT_FALSE(h.empty());
  EXPECT_TRUE(h.can_mut());
  EXPECT_EQ(h.use_count(), 1u);
  auto u = c.memory_usage().get();
  EXPECT_EQ(u.number_allocs, 1u);
  EXPECT_EQ(u.bytes_in_use, 1000u);
  EXPECT_GE(u.bytes_reserved, 1000u);
  auto r = c.get_resource(h.binding()).get();
  EXPECT_NE(r.ptr, nullptr);
  EXPECT_EQ(r.size, 1000u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(r.ptr) % 64, 0u) << "host resources are aligned";
  h.reset();
  u = c.memory_usage().get();
  EXPECT_EQ(u.number_allocs, 0u);
  EXPECT_EQ(u.bytes_in_use, 0u);
}

TEST_F(Client, ReserveZeroBytes) {
  memory_handle h = c.reserve(0).get();
  ASSERT_FALSE(h.empty());
  EXPECT_EQ(c.get_resource(h.binding()).get().size, 0u);
  EXPECT_EQ(c.memory_usage().get().number_allocs, 1u);
}

TEST_F(Client, CreateReturnsAtOnceAndLaterMessagesSeeItBound) {
  std::set<std::uint64_t> ids;
  for (std::uint64_t i = 0; i < 10'000; ++i) {
    const std::size_t size = 1 + (i * 37) % 3000;
    memory_handle h = c.create(size);
    ASSERT_FALSE(h.empty());
    ASSERT_TRUE(ids.insert(h.id().value).second) << "create gave id " << h.id().value << " twice";
    const auto bytes = pattern(i, size);
    auto w = c.write(h.binding(), bytes);
    // The read is posted after the write from this thread, so it sees the bound, written memory.
    std::vector<std::byte> back = c.read(h.binding()).get();
    w.get();
    ASSERT_EQ(back.size(), size) << "iteration " << i;
    ASSERT_TRUE(back == bytes) << "iteration " << i << ": bytes read differ from bytes written";
  }
  EXPECT_EQ(c.memory_usage().get().bytes_in_use, 0u);
  EXPECT_EQ(c.check_invariants().get(), "");
}

TEST_F(Client, CreateThenGetResourceAndSubmitSeeTheMemory) {
  memory_handle h = c.create(4096);
  auto res = c.get_resource(h.binding());
  auto sz = c.submit({h.binding()}, [](submit_context& ctx) { return ctx.resources[0].size; });
  EXPECT_EQ(res.get().size, 4096u);
  EXPECT_EQ(sz.get(), 4096u);
}

TEST_F(Client, BindMovesMemoryToAFreshHandleAndStalesTheOld) {
  memory_handle reserved = c.reserve(512).get();
  const auto bytes = pattern(7, 512);
  c.write(reserved.binding(), bytes).get();
  const void* ptr = c.get_resource(reserved.binding()).get().ptr;
  memory_handle stale = reserved;  // a copy of the reserved identity
  memory_handle assigned = memory_handle::make();
  {
    auto unbound = failure_of(c.get_resource(assigned.binding()));
    EXPECT_EQ(unbound.code, errc::not_found) << "a fresh handle has no memory yet: " << unbound.what;
  }
  c.bind(std::move(reserved), assigned).get();
  auto r = c.get_resource(assigned.binding()).get();
  EXPECT_EQ(r.ptr, ptr) << "bind keeps the memory in place";
  EXPECT_EQ(r.size, 512u);
  EXPECT_TRUE(c.read(assigned.binding()).get() == bytes);
  auto f = failure_of(c.get_resource(stale.binding()));
  EXPECT_EQ(f.code, errc::not_found) << f.what;
  EXPECT_EQ(c.memory_usage().get().number_allocs, 1u);
  stale.reset();
  EXPECT_EQ(c.memory_usage().get().number_allocs, 1u) << "dropping the stale copy frees nothing";
  assigned.reset();
  EXPECT_EQ(c.memory_usage().get().number_allocs, 0u);
  EXPECT_EQ(c.check_invariants().get(), "");
}

TEST_F(Client, GetResourceWithOffsets) {
  memory_handle h = c.reserve(1024).get();
  const auto full = c.get_resource(h.binding()).get();
  ASSERT_EQ(full.size, 1024u);
  const auto* base = static_cast<const std::byte*>(full.ptr);

  auto both = c.get_resource(h.binding(), 100, 200).get();
  EXPECT_EQ(both.ptr, base + 100);
  EXPECT_EQ(both.size, 1024u - 100 - 200);

  auto front = c.get_resource(h.binding(), 100, std::nullopt).get();
  EXPECT_EQ(front.ptr, base + 100);
  EXPECT_EQ(front.size, 924u);

  auto back = c.get_resource(h.binding(), std::nullopt, 24).get();
  EXPECT_EQ(back.ptr, base);
  EXPECT_EQ(back.size, 1000u);

  auto empty_view = c.get_resource(h.binding(), 1024, std::nullopt).get();
  EXPECT_EQ(empty_view.size, 0u);

  auto past = failure_of(c.get_resource(h.binding(), 2000, std::nullopt));
  EXPECT_EQ(past.code, errc::invalid_argument) << past.what;
  EXPECT_NE(past.what.find("2000"), std::string::npos) << past.what;
  auto too_much = failure_of(c.get_resource(h.binding(), 100, 1000));
  EXPECT_EQ(too_much.code, errc::invalid_argument) << too_much.what;
}

TEST_F(Client, WriteReadRoundTrip) {
  for (std::size_t size : {std::size_t{1}, std::size_t{63}, std::size_t{64}, std::size_t{4096}, std::size_t{mib}}) {
    memory_handle h = c.reserve(size).get();
    const auto bytes = pattern(size, size);
    c.write(h.binding(), bytes).get();
    auto back = c.read(h.binding()).get();
    ASSERT_EQ(back.size(), size);
    EXPECT_TRUE(back == bytes) << "size " << size;
    // The resource's pointer sees the same bytes (the host device has real memory).
    auto r = c.get_resource(h.binding()).get();
    EXPECT_EQ(std::memcmp(r.ptr, bytes.data(), size), 0) << "size " << size;
  }
}

TEST_F(Client, WritePrefixAndOversizedWrite) {
  memory_handle h = c.reserve(100).get();
  c.write(h.binding(), pattern(1, 100)).get();
  const auto prefix = pattern(2, 10);
  c.write(h.binding(), prefix).get();
  auto back = c.read(h.binding()).get();
  ASSERT_EQ(back.size(), 100u);
  EXPECT_TRUE(std::equal(prefix.begin(), prefix.end(), back.begin())) << "a short write fills the start";
  const auto old = pattern(1, 100);
  EXPECT_TRUE(std::equal(old.begin() + 10, old.end(), back.begin() + 10)) << "and leaves the rest";

  auto f = failure_of(c.write(h.binding(), pattern(3, 101)));
  EXPECT_EQ(f.code, errc::invalid_argument) << f.what;
  EXPECT_NE(f.what.find("101 > 100"), std::string::npos) << f.what;
  EXPECT_TRUE(c.read(h.binding()).get() == back) << "a refused write changes nothing";
}

TEST_F(Client, SubmitReturnsItsValue) {
  EXPECT_EQ(c.submit({}, [](submit_context&) { return 42; }).get(), 42);
  EXPECT_EQ(c.submit({}, [](submit_context& ctx) { return ctx.device.name; }).get(), "host");
  EXPECT_EQ(c.submit({}, [](submit_context& ctx) { return ctx.resources.size(); }).get(), 0u);
  bool ran = false;
  c.submit({}, [&ran](submit_context&) { ran = true; }).get();
  EXPECT_TRUE(ran);
}

TEST_F(Client, SubmitReceivesTheBindingsResourcesInOrder) {
  memory_handle a = c.create(100);
  memory_handle b = c.reserve(2000).get();
  memory_handle d = c.create(30000);
  using view = std::pair<void*, std::uint64_t>;
  auto views = c.submit({d.binding(), a.binding(), b.binding()}, [](submit_context& ctx) {
                  std::vector<view> out;
                  for (const auto& r : ctx.resources) out.emplace_back(r.ptr, r.size);
                  // Write a pattern through the pointers: the kernel's view of the memory.
                  std::memset(ctx.resources[0].ptr, 0xd0, ctx.resources[0].size);
                  std::memset(ctx.resources[1].ptr, 0xa0, ctx.resources[1].size);
                  std::memset(ctx.resources[2].ptr, 0xb0, ctx.resources[2].size);
                  return out;
                }).get();
  ASSERT_EQ(views.size(), 3u);
  EXPECT_EQ(views[0], view(c.get_resource(d.binding()).get().ptr, 30000));
  EXPECT_EQ(views[1], view(c.get_resource(a.binding()).get().ptr, 100));
  EXPECT_EQ(views[2], view(c.get_resource(b.binding()).get().ptr, 2000));
  EXPECT_TRUE(c.read(d.binding()).get() == std::vector<std::byte>(30000, std::byte{0xd0}));
  EXPECT_TRUE(c.read(a.binding()).get() == std::vector<std::byte>(100, std::byte{0xa0}));
  EXPECT_TRUE(c.read(b.binding()).get() == std::vector<std::byte>(2000, std::byte{0xb0}));
}

TEST_F(Client, SubmitRunsOnTheDeviceThread) {
  const auto caller = std::this_thread::get_id();
  const auto first = c.submit({}, [](submit_context&) { return std::this_thread::get_id(); }).get();
  EXPECT_NE(first, caller);
  std::thread other([&] {
    EXPECT_EQ(c.submit({}, [](submit_context&) { return std::this_thread::get_id(); }).get(), first)
        << "every message of a device runs on its one thread";
  });
  other.join();
}

TEST_F(Client, SubmitBindingKeepsMemoryAliveAfterTheHandleIsDropped) {
  memory_handle h = c.create(256);
  c.write(h.binding(), pattern(9, 256)).get();
  memory_binding b = h.binding();
  h.reset();
  // The binding keeps the memory: the submit still resolves it and sees the bytes.
  auto ok = c.submit({b}, [](submit_context& ctx) {
               return std::memcmp(ctx.resources[0].ptr, pattern(9, 256).data(), 256) == 0;
             }).get();
  EXPECT_TRUE(ok);
  EXPECT_EQ(c.memory_usage().get().number_allocs, 1u);
  b.reset();
  EXPECT_EQ(c.memory_usage().get().number_allocs, 0u);
}

TEST_F(Client, SubmitThatThrowsCompletesWithTaskFailed) {
  auto f = failure_of(c.submit({}, [](submit_context&) -> int { throw std::runtime_error("boom: kernel 7 failed"); }));
  EXPECT_FALSE(f.threw_other) << f.other;
  EXPECT_EQ(f.code, errc::task_failed);
  EXPECT_NE(f.what.find("boom: kernel 7 failed"), std::string::npos) << f.what;
  EXPECT_NE(f.what.find("boom: kernel 7 failed"), std::string::npos) << f.what;

  // A devrt::exception keeps its own kind.
  auto g = failure_of(c.submit({}, [](submit_context&) {
    devrt::error e = devrt::error::make(errc::invalid_argument, "launch grid too large");
    throw devrt::exception(e);
  }));
  EXPECT_EQ(g.code, errc::invalid_argument);
  EXPECT_NE(g.what.find("launch grid too large"), std::string::npos) << g.what;

  auto h = failure_of(c.submit({}, [](submit_context&) { throw 17; }));
  EXPECT_EQ(h.code, errc::task_failed);
  EXPECT_NE(h.what.find("non-standard"), std::string::npos) << h.what;

  // The actor keeps serving.
  EXPECT_EQ(c.submit({}, [](submit_context&) { return 1; }).get(), 1);
  EXPECT_EQ(c.check_invariants().get(), "");
}

TEST_F(Client, SubmitWithAnUnresolvableBindingDoesNotRun) {
  memory_handle reserved = c.reserve(64).get();
  memory_handle stale = reserved;
  memory_handle assigned = memory_handle::make();
  c.bind(std::move(reserved), assigned).get();
  bool ran = false;
  auto f = failure_of(c.submit({assigned.binding(), stale.binding()}, [&ran](submit_context&) { ran = true; }));
  EXPECT_EQ(f.code, errc::not_found) << f.what;
  EXPECT_FALSE(ran);
}

TEST_F(Client, CleanupReturnsUnusedPages) {
  memory_handle h = c.reserve(1000).get();
  memory_handle keep = c.reserve(300 * 1024 * 1024).get();  // a page of its own in another pool
  h.reset();
  const auto before = c.memory_usage().get();
  EXPECT_EQ(before.number_allocs, 1u);
  const auto stats_before = c.statistics().get();
  c.cleanup().get();
  const auto after = c.memory_usage().get();
  EXPECT_LT(after.bytes_reserved, before.bytes_reserved) << "the free page went back to the device";
  EXPECT_GE(after.bytes_reserved, 300u * 1024 * 1024) << "the live page stayed";
  const auto stats = c.statistics().get();
  EXPECT_EQ(stats.cleanups, stats_before.cleanups + 1);
  EXPECT_GT(stats.driver_frees, stats_before.driver_frees);
  keep.reset();
  c.cleanup().get();
  EXPECT_EQ(c.memory_usage().get().bytes_reserved, 0u);
  EXPECT_EQ(c.check_invariants().get(), "");
}

TEST(ClientConfigure, InvalidLayoutFailsAtOnceAndNothingReachesTheActor) {
  runtime rt(quiet_options());
  compute_client c = rt.host();
  const auto& actor = c.actor();
  ASSERT_EQ(actor->messages_processed(), 0u);

  std::vector<pool_config> bad{sliced_pool_config{mib, 4 * mib}};
  auto f = failure_of(c.configure(bad));
  EXPECT_EQ(f.code, errc::slice_larger_than_page) << f.what;
  EXPECT_NE(f.what.find("4194304"), std::string::npos) << f.what;
  EXPECT_NE(f.what.find("1048576"), std::string::npos) << f.what;
  EXPECT_NE(f.what.find("max_slice_size"), std::string::npos) << f.what;

  auto g = failure_of(c.configure(std::vector<pool_config>{}));
  EXPECT_EQ(g.code, errc::empty_pool_list) << g.what;
  auto h = failure_of(c.configure(std::vector<pool_config>{sliced_pool_config{mib, std::nullopt, mib / 2}}));
  EXPECT_EQ(h.code, errc::cap_smaller_than_page) << h.what;
  auto z = failure_of(c.configure(std::vector<pool_config>{sliced_pool_config{0}}));
  EXPECT_EQ(z.code, errc::zero_size) << z.what;

  // A valid request does reach the actor; once it is counted, the count shows it was the only
  // message (no waiting for a guessed time in which a stray message would have arrived).
  (void)c.memory_usage().get();
  EXPECT_TRUE(devrt_test::wait_until([&] { return actor->messages_processed() >= 1; }));
  EXPECT_EQ(actor->messages_processed(), 1u) << "an invalid layout must not be posted to the actor";
}

TEST_F(Client, ConfigureKeepsTheLayoutWhileMemoryIsLiveAndAppliesAfterRelease) {
  EXPECT_NE(c.report().get().find("sliced pool"), std::string::npos);
  memory_handle h = c.reserve(1000).get();
  memory_handle z = c.reserve(0).get();
  auto kept = c.configure(preset::exclusive_pages).get();
  EXPECT_FALSE(kept.applied);
  EXPECT_EQ(kept.live_allocations, 2u);
  EXPECT_EQ(kept.live_bytes, 1000u);
  EXPECT_NE(c.report().get().find("sliced pool"), std::string::npos) << "the layout was kept";
  EXPECT_EQ(c.get_resource(h.binding()).get().size, 1000u) << "live memory is untouched";
  h.reset();
  z.reset();
  auto applied = c.configure(preset::exclusive_pages).get();
  EXPECT_TRUE(applied.applied);
  EXPECT_EQ(applied.live_allocations, 0u);
  const std::string report = c.report().get();
  EXPECT_EQ(report.find("sliced pool"), std::string::npos) << report;
  EXPECT_NE(report.find("exclusive pool 10"), std::string::npos) << report;
  memory_handle again = c.reserve(5000).get();
  EXPECT_EQ(c.get_resource(again.binding()).get().size, 5000u);
  // And back to an explicit list.
  again.reset();
  std::vector<pool_config> pools{sliced_pool_config{4 * mib, mib}, exclusive_pool_config{64 * mib}};
  EXPECT_TRUE(c.configure(pools).get().applied);
  EXPECT_NE(c.report().get().find("sliced pool 0: page 4.00 MiB"), std::string::npos) << c.report().get();
  EXPECT_EQ(c.check_invariants().get(), "");
}

TEST_F(Client, MemoryUsageAndStatistics) {
  memory_handle a = c.reserve(100).get();
  memory_handle b = c.reserve(2000).get();
  memory_handle d = c.create(30000);
  auto u = c.memory_usage().get();
  EXPECT_EQ(u.number_allocs, 3u);
  EXPECT_EQ(u.bytes_in_use, 32100u);
  EXPECT_GE(u.bytes_reserved, u.bytes_in_use + u.bytes_padding);
  auto s = c.statistics().get();
  EXPECT_EQ(s.reserves, 3u);
  EXPECT_EQ(s.failed_reserves, 0u);
  EXPECT_EQ(s.bytes_in_use, 32100u);
  EXPECT_EQ(s.peak_bytes_in_use, 32100u);
  EXPECT_GE(s.driver_allocs, 1u);
  d.reset();
  u = c.memory_usage().get();
  EXPECT_EQ(u.number_allocs, 2u);
  EXPECT_EQ(u.bytes_in_use, 2100u);
  s = c.statistics().get();
  EXPECT_EQ(s.bytes_in_use, 2100u);
  EXPECT_EQ(s.peak_bytes_in_use, 32100u) << "the peak stays";
}

TEST_F(Client, ReportDescribesTheDevice) {
  memory_handle a = c.reserve(100).get();
  const std::string r = c.report().get();
  EXPECT_NE(r.find("memory report for host (host storage, alignment 64"), std::string::npos) << r;
  EXPECT_NE(r.find("persistent policy: enabled; mode: automatic"), std::string::npos) << r;
  EXPECT_NE(r.find("usage: 1 allocations"), std::string::npos) << r;
  EXPECT_NE(r.find("statistics:"), std::string::npos) << r;
}

TEST_F(Client, CaptureBeginEndPinsTheTouchedPersistentMemory) {
  c.capture_begin().get();
  EXPECT_NE(c.report().get().find("(capturing)"), std::string::npos);
  memory_handle a = c.reserve(1000).get();
  memory_handle b = c.create(3000);
  memory_handle freed = c.reserve(2048).get();
  freed.reset();  // freed inside the window: the graph may still use it, so it is pinned too
  devrt::runtime::device_graph graph = c.capture_end().get();
  EXPECT_EQ(graph.pins().size(), 3u);
  EXPECT_FALSE(graph.recorded()) << "the host device records no work";
  EXPECT_EQ(graph.actor(), c.actor());
  std::string r = c.report().get();
  EXPECT_NE(r.find("persistent pool: 3 slices"), std::string::npos) << r;
  EXPECT_EQ(r.find("(capturing)"), std::string::npos) << r;
  a.reset();
  b.reset();
  auto u = c.memory_usage().get();
  EXPECT_EQ(u.number_allocs, 3u) << "the pins keep the captured memory";
  EXPECT_EQ(u.bytes_in_use, 6048u);
  // After the window, reserves go to the dynamic pools again.
  memory_handle after = c.reserve(1000).get();
  EXPECT_NE(c.report().get().find("persistent pool: 3 slices"), std::string::npos);
  after.reset();
  auto copy = graph;
  graph = {};
  EXPECT_EQ(c.memory_usage().get().number_allocs, 3u) << "a copy of the graph still pins";
  copy = {};  // the last copy releases the pins on the strand
  u = c.memory_usage().get();
  EXPECT_EQ(u.number_allocs, 0u);
  EXPECT_EQ(u.bytes_in_use, 0u);
  EXPECT_EQ(c.check_invariants().get(), "");
}

TEST_F(Client, PersistentScopeRoutesReservesToThePersistentPool) {
  memory_handle h;
  memory_handle g;
  {
    auto scope = c.persistent();
    h = c.reserve(1000).get();
    g = c.create(2000);
  }
  std::string r = c.report().get();
  EXPECT_NE(r.find("persistent pool: 2 slices"), std::string::npos) << r;
  // Persistent memory survives a reconfiguration: only the dynamic pools must be empty.
  auto out = c.configure(preset::exclusive_pages).get();
  EXPECT_TRUE(out.applied) << "live persistent memory must not block configure";
  auto u = c.memory_usage().get();
  EXPECT_EQ(u.number_allocs, 2u);
  EXPECT_EQ(u.bytes_in_use, 3000u);
  c.write(g.binding(), pattern(3, 2000)).get();
  EXPECT_TRUE(c.read(g.binding()).get() == pattern(3, 2000));
  // After the scope, reserves are dynamic again: a live one blocks configure.
  memory_handle dynamic = c.reserve(100).get();
  EXPECT_FALSE(c.configure(preset::sub_slices).get().applied);
  EXPECT_NE(c.report().get().find("persistent pool: 2 slices"), std::string::npos);
  EXPECT_EQ(c.check_invariants().get(), "");
}

TEST_F(Client, PersistentScopesNest) {
  memory_handle inner_done;
  memory_handle outer_only;
  {
    auto outer = c.persistent();
    {
      auto inner = c.persistent();
      (void)inner;
    }
    // The inner scope closed, the outer is still open: still persistent.
    inner_done = c.reserve(128).get();
    {
      auto moved_from = c.persistent();
      auto moved = std::move(moved_from);  // a moved-from scope closes nothing
    }
    outer_only = c.reserve(256).get();
  }
  memory_handle dynamic = c.reserve(512).get();
  std::string r = c.report().get();
  EXPECT_NE(r.find("persistent pool: 2 slices"), std::string::npos) << r;
  EXPECT_FALSE(c.configure(preset::exclusive_pages).get().applied) << "the last reserve is dynamic";
  dynamic.reset();
  EXPECT_TRUE(c.configure(preset::exclusive_pages).get().applied);
  EXPECT_EQ(c.memory_usage().get().bytes_in_use, 384u);
}

TEST_F(Client, CheckInvariantsHoldsAfterMixedWork) {
  EXPECT_EQ(c.check_invariants().get(), "");
  std::vector<memory_handle> hs;
  for (std::uint64_t i = 0; i < 200; ++i) hs.push_back(i % 2 == 0 ? c.create(i * 97) : c.reserve(i * 1031).get());
  for (std::size_t i = 0; i < hs.size(); i += 3) hs[i].reset();
  EXPECT_EQ(c.check_invariants().get(), "");
  c.cleanup().get();
  EXPECT_EQ(c.check_invariants().get(), "");
  hs.clear();
  EXPECT_EQ(c.memory_usage().get().bytes_in_use, 0u);
  EXPECT_EQ(c.check_invariants().get(), "");
}

}  // namespace

namespace {

// Without a layout in the options, a device that maps memory gets an arena: memory is mapped under
// live allocations only, and given back when it is freed and cleaned up.
TEST(DefaultLayout, TheHostGetsAnArena) {
  devrt::runtime::runtime_options o;
  o.use_environment = false;
  o.use_cuda = false;
  devrt::runtime::runtime rt(o);
  auto c = rt.host();
  EXPECT_NE(c.report().get().find("arena pool 0"), std::string::npos) << c.report().get();
  {
    memory_handle h = c.reserve(3 << 20).get();
    const auto s = c.statistics().get();
    EXPECT_GE(s.maps, 1u);
    EXPECT_EQ(s.driver_allocs, 0u);
    EXPECT_EQ(s.bytes_reserved, 4u << 20) << "two 2 MiB granules under a 3 MiB allocation";
  }
  c.cleanup().get();
  EXPECT_EQ(c.statistics().get().bytes_reserved, 0u);
}

}  // namespace
