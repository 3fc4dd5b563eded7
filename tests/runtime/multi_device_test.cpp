// Several devices in one process, without a GPU: peer-access options and their errors, copies
// between allocations through the copy path (one host device, and two host devices of two
// runtimes, which take the two-strand path that copies between GPUs take), the runtime's report
// of every device. The GPU side is in tests/cuda/multi_gpu_test.cpp.
#include "devrt/runtime/copy.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <future>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "devrt/devices/peer_access.hpp"
#include "devrt/runtime/peer_access.hpp"
#include "devrt/runtime/runtime.hpp"
#include "runtime_test_util.hpp"

#ifdef DEVRT_WITH_CUDA
#include "devrt/devices/cuda_storage.hpp"
#endif

namespace {

using devrt::errc;
using devrt::memory::memory_handle;
using devrt::runtime::copy;
using devrt::runtime::error_code;
using devrt::runtime::runtime;
using devrt::runtime::runtime_options;
using devrt::runtime::set_peer_access;
using devrt_test::failure_of;
using devrt_test::pattern;
using devrt_test::quiet_options;

bool contains(const std::string& s, const std::string& n) { return s.find(n) != std::string::npos; }

int visible_cuda_devices() {
#ifdef DEVRT_WITH_CUDA
  return devrt::devices::cuda_device_count();
#else
  return 0;
#endif
}

runtime_options with_sim() {
  runtime_options o = quiet_options();
  o.sim = devrt::devices::sim_options{};
  return o;
}

// ---- Peer access ----

TEST(PeerAccess, ValidationNamesTheDevices) {
  const std::vector<int> one{1};
  EXPECT_TRUE(devrt::devices::validate_peers(0, one, 2));
  EXPECT_TRUE(devrt::devices::validate_peers(0, one, std::nullopt));

  auto absent = devrt::devices::validate_peers(0, one, 1);
  ASSERT_EQ(absent.code(), errc::invalid_argument);
  EXPECT_TRUE(contains(absent.err().message(), "cuda:0 -> cuda:1, 1 device(s)")) << absent.err().message();

  const std::vector<int> self{1, 0};
  auto own = devrt::devices::validate_peers(0, self, 2);
  ASSERT_EQ(own.code(), errc::invalid_argument);
  EXPECT_TRUE(contains(own.err().message(), "cuda:0 -> cuda:0")) << own.err().message();
  EXPECT_TRUE(contains(own.err().message(), "not its own peer")) << own.err().message();

  const std::vector<int> twice{1, 2, 1};
  auto dup = devrt::devices::validate_peers(0, twice, 4);
  ASSERT_EQ(dup.code(), errc::invalid_argument);
  EXPECT_TRUE(contains(dup.err().message(), "listed twice")) << dup.err().message();

  const std::vector<int> negative{-2};
  auto neg = devrt::devices::validate_peers(0, negative, std::nullopt);
  ASSERT_EQ(neg.code(), errc::invalid_argument);
  EXPECT_TRUE(contains(neg.err().message(), "cuda:0 -> cuda:-2")) << neg.err().message();

  auto device_absent = devrt::devices::validate_peers(3, one, 2);
  ASSERT_EQ(device_absent.code(), errc::invalid_argument);
  EXPECT_TRUE(contains(device_absent.err().message(), "cuda:3, 2 device(s)")) << device_absent.err().message();
}

TEST(PeerAccess, OptionsAreCheckedAtStart) {
  for (const auto& [bad, says] :
       std::vector<std::pair<std::map<int, std::vector<int>>, std::string>>{{{{0, {0}}}, "cuda:0 -> cuda:0"},
                                                                            {{{1, {0, 0}}}, "cuda:1 -> cuda:0"},
                                                                            {{{0, {-1}}}, "cuda:0 -> cuda:-1"},
                                                                            {{{-1, {0}}}, "cuda:-1"}}) {
    runtime_options o = quiet_options();
    o.peer_access = bad;
    auto r = runtime::create(o);
    ASSERT_EQ(r.code(), errc::invalid_argument) << says;
    EXPECT_TRUE(contains(r.err().message(), says)) << r.err().message();
  }
  // A well-formed list starts; the devices it names are checked when they are first used.
  runtime_options o = quiet_options();
  o.peer_access = {{0, {1}}, {1, {0}}};
  EXPECT_TRUE(runtime::create(o));
}

TEST(PeerAccess, ToADeviceThatIsNotThere) {
  if (visible_cuda_devices() > 1) GTEST_SKIP() << "this machine has two GPUs: the peer would be there";
  runtime_options o = quiet_options();
  o.use_cuda = true;
  o.peer_access = {{0, {1}}};
  runtime rt(o);
  try {
    (void)rt.cuda(0);
    FAIL() << "cuda:0 with a peer cuda:1 on a machine without a second GPU";
  } catch (const devrt::exception& e) {
    // Without a GPU cuda:0 itself is missing; with one, the peer is.
    if (visible_cuda_devices() == 0) {
      EXPECT_EQ(e.code(), errc::not_found) << e.what();
    } else {
      EXPECT_EQ(e.code(), errc::invalid_argument) << e.what();
      EXPECT_TRUE(contains(e.what(), "cuda:0 -> cuda:1, 1 device(s)")) << e.what();
    }
  }
}

TEST(PeerAccess, HostAndSimDevicesHaveNoPeers) {
  runtime rt(with_sim());
  auto host = failure_of(set_peer_access(rt.host(), {0}));
  EXPECT_EQ(host.code, errc::unsupported);
  EXPECT_TRUE(contains(host.what, "host:0")) << host.what;
  EXPECT_TRUE(contains(host.what, "for CUDA devices")) << host.what;
  auto sim = failure_of(set_peer_access(rt.sim(), {}));
  EXPECT_EQ(sim.code, errc::unsupported);
  EXPECT_TRUE(contains(sim.what, "sim:0")) << sim.what;
}

// ---- Copies ----

std::vector<std::byte> read_all(const devrt::runtime::compute_client& c, const memory_handle& h) {
  return c.read(h.binding()).get();
}

TEST(Copy, WithinTheHostDevice) {
  runtime rt(quiet_options());
  auto host = rt.host();
  for (const std::uint64_t n : {std::uint64_t{1}, std::uint64_t{4096}, std::uint64_t{3} << 20}) {
    auto a = host.reserve(n).get();
    auto b = host.reserve(n).get();
    const auto bytes = pattern(n, n);
    host.write(a.binding(), bytes).get();
    copy(host, a, host, b).get();
    EXPECT_EQ(read_all(host, b), bytes) << n;
    EXPECT_EQ(read_all(host, a), bytes) << n;  // the source is untouched
  }
  // A copy onto itself leaves the bytes as they are.
  auto a = host.reserve(64).get();
  host.write(a.binding(), pattern(7, 64)).get();
  copy(host, a, host, a).get();
  EXPECT_EQ(read_all(host, a), pattern(7, 64));
}

TEST(Copy, BetweenTwoHostDevicesTakesTheTwoStrandPath) {
  runtime one(quiet_options());
  runtime two(quiet_options());
  auto a = one.host();
  auto b = two.host();
  ASSERT_NE(a.actor(), b.actor());
  auto x = a.reserve(1 << 20).get();
  auto y = b.reserve(1 << 20).get();
  const auto bytes = pattern(11, 1 << 20);
  a.write(x.binding(), bytes).get();
  copy(a, x, b, y).get();
  EXPECT_EQ(read_all(b, y), bytes);
  // And back, into fresh memory of the first.
  auto z = a.reserve(1 << 20).get();
  copy(b, y, a, z).get();
  EXPECT_EQ(read_all(a, z), bytes);
}

TEST(Copy, PipelinesNeverWait) {
  // Created handles and a write posted before the copy by the same thread: the copy sees both.
  runtime one(quiet_options());
  runtime two(quiet_options());
  auto a = one.host();
  auto b = two.host();
  auto x = a.create(8192);
  auto y = b.create(8192);
  a.write(x.binding(), pattern(3, 8192));
  auto done = copy(a, x, b, y);
  auto local = a.create(8192);
  auto local_done = copy(a, x, a, local);
  done.get();
  local_done.get();
  EXPECT_EQ(read_all(b, y), pattern(3, 8192));
  EXPECT_EQ(read_all(a, local), pattern(3, 8192));
}

TEST(Copy, CompletesThroughCallbacksWithErrorCodeFirst) {
  runtime one(quiet_options());
  runtime two(quiet_options());
  auto a = one.host();
  auto b = two.host();
  auto x = a.reserve(256).get();
  auto y = b.reserve(256).get();
  auto small = b.reserve(128).get();
  std::promise<error_code> ok, bad;
  copy(a, x, b, y, [&](error_code ec) { ok.set_value(ec); });
  copy(a, x, b, small, [&](error_code ec) { bad.set_value(ec); });
  EXPECT_FALSE(ok.get_future().get());
  EXPECT_EQ(bad.get_future().get(), errc::invalid_argument);
}

TEST(Copy, SizesMustMatch) {
  runtime one(quiet_options());
  runtime two(quiet_options());
  auto host = one.host();
  auto a = host.reserve(1000).get();
  auto b = host.reserve(2000).get();
  auto same = failure_of(copy(host, a, host, b));
  EXPECT_EQ(same.code, errc::invalid_argument);
  EXPECT_TRUE(contains(same.what, "source 1000 bytes, destination 2000 bytes")) << same.what;
  auto other = two.host().reserve(2000).get();
  auto across = failure_of(copy(host, a, two.host(), other));
  EXPECT_EQ(across.code, errc::invalid_argument);
  EXPECT_TRUE(contains(across.what, "source 1000 bytes, destination 2000 bytes")) << across.what;
}

TEST(Copy, RefusesWhatItDoesNotServe) {
  runtime rt(with_sim());
  auto host = rt.host();
  auto sim = rt.sim();
  auto h = host.reserve(64).get();
  auto s = sim.reserve(64).get();
  auto s2 = sim.reserve(64).get();
  for (const auto& f :
       {failure_of(copy(sim, s, sim, s2)), failure_of(copy(host, h, sim, s)), failure_of(copy(sim, s, host, h))}) {
    EXPECT_EQ(f.code, errc::unsupported) << f.what;
    EXPECT_TRUE(contains(f.what, "sim")) << f.what;
  }
  // A handle of neither device, an empty one: not found.
  runtime other(quiet_options());
  auto foreign = other.host().reserve(64).get();
  auto h2 = host.reserve(64).get();
  EXPECT_EQ(failure_of(copy(host, foreign, host, h2)).code, errc::not_found);
  EXPECT_EQ(failure_of(copy(host, h2, host, memory_handle())).code, errc::not_found);
  EXPECT_EQ(failure_of(copy(host, foreign, other.host(), h2)).code, errc::not_found);
  // A default client refers to no device.
  EXPECT_THROW((void)copy(devrt::runtime::compute_client(), h, host, h2), devrt::exception);
}

TEST(Copy, AfterShutdown) {
  runtime one(quiet_options());
  runtime two(quiet_options());
  auto a = one.host();
  auto b = two.host();
  auto x = a.reserve(64).get();
  auto y = b.reserve(64).get();
  two.shutdown();
  EXPECT_EQ(failure_of(copy(a, x, b, y)).code, errc::shutdown);
  one.shutdown();
  EXPECT_EQ(failure_of(copy(a, x, a, x)).code, errc::shutdown);
}

TEST(Copy, ManyThreadsBetweenTwoDevices) {
  runtime one(quiet_options());
  runtime two(quiet_options());
  const devrt::runtime::compute_client devs[2] = {one.host(), two.host()};
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 40; ++i) {
        const auto& from = devs[(t + i) % 2];
        const auto& to = devs[(t + i + (i % 3 == 0 ? 0 : 1)) % 2];
        const std::size_t n = 512 + 64 * static_cast<std::size_t>((t * 40 + i) % 50);
        const auto seed = static_cast<std::uint64_t>(t * 1000 + i);
        auto x = from.create(n);
        auto y = to.create(n);
        from.write(x.binding(), pattern(seed, n));
        copy(from, x, to, y).get();
        x.reset();  // the copy is done: the source may go at once
        if (to.read(y.binding()).get() != pattern(seed, n)) bad.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(devs[0].check_invariants().get(), "");
  EXPECT_EQ(devs[1].check_invariants().get(), "");
}

// ---- The runtime's report ----

TEST(RuntimeReport, ListsEveryStartedDeviceSideBySide) {
  runtime rt(with_sim());
  auto h = rt.host().reserve(1 << 20).get();
  auto s = rt.sim().reserve(4096).get();
  const auto r = rt.report();
  ASSERT_EQ(r.devices.size(), 2U);
  EXPECT_EQ(r.devices[0].device.kind, devrt::runtime::device_kind::host);
  EXPECT_EQ(r.devices[1].device.kind, devrt::runtime::device_kind::sim);
  EXPECT_EQ(r.devices[0].statistics.bytes_in_use, 1U << 20);
  EXPECT_EQ(r.devices[1].statistics.bytes_in_use, 4096U);
  EXPECT_TRUE(r.devices[0].error.empty());
  EXPECT_FALSE(r.devices[0].report.empty());

  const std::string table = r.table();
  for (const char* word : {"host", "sim", "reserved", "peak reserved", "in use", "peak in use", "driver allocs",
                           "driver frees", "1.00 MiB", "4.00 KiB"}) {
    EXPECT_TRUE(contains(table, word)) << word << "\n" << table;
  }
  // One line per statistic plus the header; the devices are columns on the same lines.
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), 11);
  const std::string all = r.to_string();
  EXPECT_TRUE(contains(all, table));
  EXPECT_TRUE(contains(all, "== host ==")) << all;
  EXPECT_TRUE(contains(all, "== sim ==")) << all;
  EXPECT_TRUE(contains(all, r.devices[1].report));
}

TEST(RuntimeReport, AfterShutdownSaysWhy) {
  runtime rt(quiet_options());
  rt.shutdown();
  const auto r = rt.report();
  ASSERT_EQ(r.devices.size(), 1U);
  EXPECT_TRUE(contains(r.devices[0].error, "shut down")) << r.devices[0].error;
  EXPECT_TRUE(contains(r.table(), "-")) << r.table();
}

}  // namespace
