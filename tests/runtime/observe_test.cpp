// What a server watches: runtime::snapshot (every device, in PyTorch's snapshot format),
// runtime::record_memory_history (devices started later included) and runtime::metrics_text
// (OpenMetrics), parsed back and checked against the statistics.
#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "devrt/runtime/runtime.hpp"
#include "runtime_test_util.hpp"

using devrt::memory::memory_handle;
using devrt::memory::memory_snapshot;
using devrt::memory::trace_action;
using devrt::runtime::runtime;
using devrt::runtime::runtime_options;

namespace {

runtime_options with_sim() {
  runtime_options o = devrt_test::quiet_options();
  o.use_cuda = false;
  o.sim = devrt::devices::sim_options{};
  o.sim->props.map_granularity = 2 << 20;
  return o;
}

struct sample {
  std::string family;  // the family the sample belongs to
  std::string type;    // its family's TYPE
  double value = 0;
};

/// Parses OpenMetrics text: "# TYPE", "# UNIT", "# HELP" lines and samples `name{device="d"} v`,
/// ending in "# EOF". Fails the test on a line that is none of these, on a sample of no declared
/// family, and on a counter sample without the `_total` suffix.
std::map<std::string, std::map<std::string, sample>> parse(const std::string& text) {
  std::map<std::string, std::map<std::string, sample>> out;  // sample name -> device -> sample
  std::map<std::string, std::string> types;
  std::istringstream in(text);
  std::string line;
  bool eof = false;
  while (std::getline(in, line)) {
    EXPECT_FALSE(eof) << "a line after # EOF: " << line;
    if (line == "# EOF") {
      eof = true;
      continue;
    }
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream l(line.substr(7));
      std::string name;
      std::string type;
      l >> name >> type;
      EXPECT_TRUE(type == "gauge" || type == "counter") << line;
      EXPECT_EQ(types.count(name), 0u) << "declared twice: " << name;
      types[name] = type;
      continue;
    }
    if (line.rfind("# UNIT ", 0) == 0) {
      std::istringstream l(line.substr(7));
      std::string name;
      std::string unit;
      l >> name >> unit;
      EXPECT_EQ(unit, "bytes");
      EXPECT_TRUE(name.size() > 6 && name.substr(name.size() - 6) == "_bytes") << "a unit is the name's suffix";
      continue;
    }
    if (line.rfind("# HELP ", 0) == 0) continue;
    const auto brace = line.find("{device=\"");
    const auto close = line.find("\"} ");
    EXPECT_NE(brace, std::string::npos) << "not a sample: " << line;
    EXPECT_NE(close, std::string::npos) << "not a sample: " << line;
    if (brace == std::string::npos || close == std::string::npos) continue;
    const std::string name = line.substr(0, brace);
    const std::string device = line.substr(brace + 9, close - brace - 9);
    std::string family = name;
    if (types.count(family) == 0 && name.size() > 6 && name.substr(name.size() - 6) == "_total") {
      family = name.substr(0, name.size() - 6);
    }
    EXPECT_EQ(types.count(family), 1u) << "a sample of no declared family: " << line;
    if (types[family] == "counter") {
      EXPECT_NE(name, family) << "a counter's sample ends in _total: " << line;
    }
    out[name][device] = sample{family, types[family], std::stod(line.substr(close + 3))};
  }
  EXPECT_TRUE(eof) << "no # EOF";
  return out;
}

}  // namespace

TEST(Metrics, TheTextParsesBackToEachDevicesStatistics) {
  runtime rt(with_sim());
  auto host = rt.host();
  auto sim = rt.sim();
  std::vector<memory_handle> live;
  for (int i = 0; i < 10; ++i) live.push_back(host.reserve(static_cast<std::uint64_t>(i + 1) << 16).get());
  live.push_back(sim.reserve(3 << 20).get());
  live.erase(live.begin(), live.begin() + 3);
  const auto hs = host.statistics().get();
  const auto ss = sim.statistics().get();
  const auto m = parse(rt.metrics_text());
  ASSERT_EQ(m.count("devrt_reserved_bytes"), 1u);
  EXPECT_EQ(m.at("devrt_reserved_bytes").at("host").value, static_cast<double>(hs.bytes_reserved));
  EXPECT_EQ(m.at("devrt_reserved_bytes").at("sim").value, static_cast<double>(ss.bytes_reserved));
  EXPECT_EQ(m.at("devrt_in_use_bytes").at("host").value, static_cast<double>(hs.bytes_in_use));
  EXPECT_EQ(m.at("devrt_peak_in_use_bytes").at("host").value, static_cast<double>(hs.peak_bytes_in_use));
  EXPECT_EQ(m.at("devrt_peak_reserved_bytes").at("sim").value, static_cast<double>(ss.peak_bytes_reserved));
  EXPECT_EQ(m.at("devrt_live_allocations").at("host").value, 7.0);
  EXPECT_EQ(m.at("devrt_reserves_total").at("host").value, 10.0);
  EXPECT_EQ(m.at("devrt_reserves_total").at("host").type, "counter");
  EXPECT_EQ(m.at("devrt_maps_total").at("host").value, static_cast<double>(hs.maps));
  EXPECT_EQ(m.at("devrt_unmaps_total").at("sim").value, static_cast<double>(ss.unmaps));
  for (const char* name :
       {"devrt_returning_bytes", "devrt_held_for_streams_bytes", "devrt_peak_busy_bytes", "devrt_failed_reserves_total",
        "devrt_out_of_memory_errors_total", "devrt_device_refusals_total", "devrt_fences_total",
        "devrt_stream_waits_total", "devrt_driver_allocs_total", "devrt_driver_frees_total", "devrt_cleanups_total",
        "devrt_reclaims_total", "devrt_streams"}) {
    ASSERT_EQ(m.count(name), 1u) << name;
    EXPECT_EQ(m.at(name).size(), 2u) << name << ": one sample per device";
  }
}

TEST(Metrics, OutOfMemoryErrorsAreCounted) {
  runtime_options o = devrt_test::quiet_options();
  o.use_cuda = false;
  o.host.capacity = 8 << 20;
  o.host_layout = devrt::memory::preset::automatic;  // an arena: memory mapped as needed
  runtime rt(o);
  auto host = rt.host();
  auto keep = host.reserve(6 << 20).get();
  EXPECT_THROW((void)host.reserve(4 << 20).get(), std::exception);
  const auto m = parse(rt.metrics_text());
  EXPECT_EQ(m.at("devrt_out_of_memory_errors_total").at("host").value, 1.0);
  EXPECT_GE(m.at("devrt_failed_reserves_total").at("host").value, 1.0);
}

// After a shutdown the observers answer without the devices that are gone, as report() does,
// rather than throw (a /metrics handler may run while the server shuts down).
TEST(Metrics, AfterAShutdownTheObserversLeaveTheDevicesOut) {
  runtime rt(with_sim());
  auto keep = rt.host().reserve(1 << 20).get();
  ASSERT_FALSE(rt.snapshot().empty());
  rt.shutdown();
  std::string text;
  ASSERT_NO_THROW(text = rt.metrics_text());
  EXPECT_TRUE(text.ends_with("# EOF\n")) << text;
  EXPECT_EQ(text.find("device=\""), std::string::npos) << text;
  std::vector<memory_snapshot> snaps;
  ASSERT_NO_THROW(snaps = rt.snapshot());
  EXPECT_TRUE(snaps.empty());
  EXPECT_NO_THROW(rt.record_memory_history(true));
  EXPECT_FALSE(rt.report().devices.empty()) << "report lists the devices with the reason";
}

TEST(RuntimeSnapshot, EveryDeviceInOrderConsistentWithItsStatistics) {
  runtime rt(with_sim());
  rt.record_memory_history(true, 1000);
  auto a = rt.host().reserve(1 << 20).get();
  auto b = rt.sim().reserve(5 << 20).get();
  { auto c = rt.host().reserve(4096).get(); }
  const std::vector<memory_snapshot> snaps = rt.snapshot();
  ASSERT_EQ(snaps.size(), 2u);
  EXPECT_EQ(snaps[0].device, "host");
  EXPECT_EQ(snaps[1].device, "sim");
  for (const auto& s : snaps) {
    SCOPED_TRACE(s.device);
    EXPECT_EQ(s.device_index, -1);
    EXPECT_EQ(s.check(), "");
    EXPECT_FALSE(s.segments.empty());
    EXPECT_FALSE(s.trace.empty()) << "history was on from the start";
  }
  std::size_t frees = 0;
  for (const auto& e : snaps[0].trace) frees += e.action == trace_action::free_completed ? 1 : 0;
  EXPECT_EQ(frees, 1u);
  const std::string pickle = devrt::memory::to_pickle(snaps);
  EXPECT_NE(pickle.find("sim"), std::string::npos);
  rt.record_memory_history(false);
  { auto d = rt.host().reserve(4096).get(); }
  EXPECT_EQ(rt.snapshot()[0].trace.size(), snaps[0].trace.size() + 0u) << "stopped: nothing more is recorded";
}

TEST(RuntimeSnapshot, AnOutOfMemoryErrorSaysWhatExplainsIt) {
  runtime_options o = devrt_test::quiet_options();
  o.use_cuda = false;
  o.host.capacity = 16 << 20;
  o.host_layout = devrt::memory::preset::automatic;
  runtime rt(o);
  auto host = rt.host();
  auto keep = host.reserve(10 << 20).get();
  try {
    (void)host.reserve(12 << 20).get();
    FAIL() << "the host has 16 MiB";
  } catch (const std::exception& e) {
    const std::string msg = e.what();
    SCOPED_TRACE(msg);
    EXPECT_NE(msg.find("request: 12.00 MiB (12582912 bytes) on host"), std::string::npos);
    EXPECT_NE(msg.find("device: capacity 16.00 MiB, free "), std::string::npos);
    EXPECT_NE(msg.find("the 1 largest live allocations (of 1):"), std::string::npos);
    EXPECT_NE(msg.find("10.00 MiB (10485760 bytes) at 0x"), std::string::npos);
    EXPECT_NE(msg.find("hint: "), std::string::npos);
  }
}
