// Snapshots (PyTorch's format) and the out-of-memory report: the blocks of every segment add up to
// it, the segments to the bytes reserved, the live blocks to the bytes in use, on every pool kind;
// the trace keeps alloc before free_completed; and an out-of-memory error explains itself.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "devrt/devices/host_storage.hpp"
#include "devrt/devices/sim_storage.hpp"
#include "devrt/memory/memory_manager.hpp"
#include "devrt/memory/snapshot.hpp"

using namespace devrt;
using namespace devrt::memory;

namespace {

constexpr std::uint64_t mib = 1ULL << 20;

std::unique_ptr<memory_manager> sim_manager(const char* layout, std::uint64_t capacity = 0, bool streams = false) {
  devices::sim_options o;
  o.props.map_granularity = 2 * mib;
  o.props.capacity = capacity;
  o.streams = streams;
  manager_options opts;
  opts.name = "sim";
  opts.layout = parse_layout(layout).value();
  return std::make_unique<memory_manager>(storage::make<devices::sim_storage>(o), opts);
}

std::size_t count(const std::vector<trace_entry>& t, trace_action a) {
  std::size_t n = 0;
  for (const auto& e : t) n += e.action == a ? 1 : 0;
  return n;
}

}  // namespace

class SnapshotLayouts : public ::testing::TestWithParam<const char*> {};

TEST_P(SnapshotLayouts, BlocksAddUpToSegmentsAndSegmentsToTheStatistics) {
  auto m = sim_manager(GetParam());
  m->record_history(true, 1'000'000);
  std::mt19937_64 rng(7);
  std::vector<memory_handle> live;
  for (int step = 0; step < 600; ++step) {
    if (live.empty() || rng() % 3 != 0) {
      const std::uint64_t size = rng() % 4 == 0 ? (rng() % 24 + 1) * mib : rng() % (256 * 1024) + 1;
      if (auto r = m->reserve(size)) live.push_back(std::move(*r));
    } else {
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(rng() % live.size()));
    }
    if (step % 50 == 0) {
      const memory_snapshot s = m->snapshot();
      ASSERT_EQ(s.check(), "") << "step " << step;
    }
  }
  if (std::string(GetParam()).find("exclusive") == std::string::npos) {
    // A persistent allocation too, where the layout keeps one.
    m->mode(allocation_mode::persistent);
    live.push_back(m->reserve(3 * mib).value());
    m->mode(allocation_mode::automatic);
  }
  const memory_snapshot s = m->snapshot();
  EXPECT_EQ(s.check(), "");
  EXPECT_EQ(s.total_reserved(), s.statistics.bytes_reserved);
  EXPECT_EQ(s.total_allocated(), s.statistics.bytes_in_use);
  std::size_t allocated = 0;
  for (const auto& g : s.segments) {
    for (const auto& b : g.blocks) {
      if (b.state != block_state::allocated) continue;
      ++allocated;
      EXPECT_GT(b.sequence, 0u);
      EXPECT_LE(b.sequence, s.statistics.reserves);
    }
  }
  EXPECT_EQ(allocated, live.size());
  EXPECT_EQ(s.trace_dropped, 0u);
  EXPECT_EQ(count(s.trace, trace_action::alloc), s.statistics.reserves);
  EXPECT_GT(count(s.trace, trace_action::segment_alloc), 0u);
  // Every free completed here at once (no streams): as many completions as requests.
  EXPECT_EQ(count(s.trace, trace_action::free_requested), count(s.trace, trace_action::free_completed));
  live.clear();
  ASSERT_TRUE(m->cleanup(true));
  const memory_snapshot after = m->snapshot();
  EXPECT_EQ(after.check(), "");
  EXPECT_EQ(after.total_allocated(), 0u);
  EXPECT_GT(count(after.trace, trace_action::segment_free), 0u);
}

INSTANTIATE_TEST_SUITE_P(EveryPoolKind, SnapshotLayouts,
                         ::testing::Values("arena", "sliced:page=8MiB,slice=2MiB;exclusive:max=64MiB",
                                           "sliced:page=4MiB,slice=4MiB,cap=40MiB;exclusive:max=64MiB"));

TEST(Snapshot, ACheckFindsBlocksThatDoNotAddUp) {
  auto m = sim_manager("arena");
  auto h = m->reserve(mib).value();
  memory_snapshot s = m->snapshot();
  ASSERT_EQ(s.check(), "");
  ASSERT_FALSE(s.segments.empty());
  s.segments[0].blocks.back().size += 512;
  EXPECT_NE(s.check().find("add up"), std::string::npos) << s.check();
  s = m->snapshot();
  s.statistics.bytes_in_use += 1;
  EXPECT_NE(s.check().find("in use"), std::string::npos) << s.check();
  s = m->snapshot();
  s.trace.push_back(trace_entry{trace_action::free_completed, 0x1234, 8, streams::device, 0, 0});
  EXPECT_NE(s.check().find("follows no alloc"), std::string::npos) << s.check();
}

TEST(Snapshot, HistoryIsOffUntilAskedAndTheRingKeepsTheNewest) {
  auto m = sim_manager("arena");
  { auto h = m->reserve(mib).value(); }
  EXPECT_TRUE(m->snapshot().trace.empty()) << "nothing is recorded before record_history";
  m->record_history(true, 4);
  for (int i = 1; i <= 5; ++i) auto h = m->reserve(static_cast<std::uint64_t>(i) * 4096).value();
  const memory_snapshot s = m->snapshot();
  ASSERT_EQ(s.trace.size(), 4u);
  EXPECT_GT(s.trace_dropped, 0u);
  EXPECT_EQ(s.check(), "") << "a dropped alloc does not make its free_completed an error";
  // The newest last: the fifth reserve's free is the last entry.
  EXPECT_EQ(s.trace.back().action, trace_action::free_completed);
  EXPECT_EQ(s.trace.back().size, 5u * 4096);
  for (std::size_t i = 1; i < s.trace.size(); ++i) EXPECT_GE(s.trace[i].time_us, s.trace[i - 1].time_us);
  m->record_history(false, 4);
  { auto h = m->reserve(mib).value(); }
  EXPECT_EQ(m->snapshot().trace.size(), 4u) << "stopping keeps the trace and adds nothing";
  m->record_history(true, 16);
  EXPECT_TRUE(m->snapshot().trace.empty()) << "starting anew clears it";
}

TEST(Snapshot, MemoryHeldForOtherStreamsIsPendingFreeAndCompletesLater) {
  auto m = sim_manager("arena", 0, true);
  auto* sim = m->backing_storage().backend<devices::sim_storage>();
  m->record_history(true, 1000);
  constexpr stream_id a = 0x1000;
  constexpr stream_id b = 0x2000;
  auto h = m->reserve(mib, a).value();
  ASSERT_TRUE(m->record_stream(h.binding(), b));
  h.reset();
  ASSERT_TRUE(m->end_batch());
  memory_snapshot s = m->snapshot();
  EXPECT_EQ(s.check(), "");
  std::size_t pending = 0;
  for (const auto& g : s.segments) {
    for (const auto& blk : g.blocks) {
      if (blk.state == block_state::pending_free) {
        ++pending;
        EXPECT_EQ(blk.stream, a);
        EXPECT_EQ(blk.requested_size, mib);
      }
    }
  }
  EXPECT_EQ(pending, 1u) << "memory two streams used stays pending until both fences pass";
  EXPECT_EQ(count(s.trace, trace_action::free_requested), 1u);
  EXPECT_EQ(count(s.trace, trace_action::free_completed), 0u);
  sim->progress();
  ASSERT_TRUE(m->end_batch());
  s = m->snapshot();
  EXPECT_EQ(s.check(), "");
  EXPECT_EQ(count(s.trace, trace_action::free_completed), 1u) << "the free completes once the fences passed";
  EXPECT_EQ(s.trace.back().action, trace_action::free_completed);
  EXPECT_EQ(s.trace.back().stream, a);
}

TEST(Snapshot, AddressesAreTheHostsOwnOnTheHost) {
  devices::host_options o;
  manager_options opts;
  opts.name = "host";
  memory_manager m(storage::make<devices::host_storage>(o), opts);
  m.record_history(true, 100);
  auto h = m.reserve(100'000).value();
  const memory_snapshot s = m.snapshot();
  ASSERT_EQ(s.check(), "");
  const auto want = reinterpret_cast<std::uintptr_t>(h.ptr());  // NOLINT
  bool found = false;
  for (const auto& g : s.segments) {
    for (const auto& b : g.blocks) found = found || (b.address == want && b.state == block_state::allocated);
  }
  EXPECT_TRUE(found) << "the live block is at the allocation's address";
  ASSERT_FALSE(s.trace.empty());
  EXPECT_EQ(s.trace.back().action, trace_action::alloc);
  EXPECT_EQ(s.trace.back().address, want);
}

TEST(Snapshot, JsonAndPickleCarryEverySegment) {
  auto m = sim_manager("sliced:page=4MiB,slice=1MiB;exclusive:max=64MiB");
  auto a = m->reserve(1000).value();
  auto b = m->reserve(10 * mib).value();
  memory_snapshot s = m->snapshot();
  const std::string json = to_json(s);
  EXPECT_NE(json.find("\"state\": \"active_allocated\""), std::string::npos);
  EXPECT_NE(json.find("\"requested_size\": 1000"), std::string::npos);
  EXPECT_NE(json.find("\"pool\": \"exclusive 1\""), std::string::npos);
  const std::string p = to_pickle({s});
  ASSERT_GE(p.size(), 3u);
  EXPECT_EQ(p.substr(0, 2), std::string("\x80\x02", 2)) << "pickle protocol 2";
  EXPECT_EQ(p.back(), '.');
  EXPECT_NE(p.find("active_allocated"), std::string::npos);
  EXPECT_NE(p.find("device_traces"), std::string::npos);
}

// -- the out-of-memory report --

TEST(OutOfMemoryReport, NamesTheRequestTheDeviceDevrtsFiguresAndTheLargestAllocations) {
  auto m = sim_manager("arena", 64 * mib);
  std::vector<memory_handle> live;
  for (std::uint64_t n : {8, 16, 4, 12, 2, 2, 2, 2, 2, 2, 2, 2}) live.push_back(m->reserve(n * mib, 0x77).value());
  auto r = m->reserve(40 * mib, 0x77);
  ASSERT_EQ(r.code(), errc::out_of_memory);
  const std::string msg = r.err().message();
  SCOPED_TRACE(msg);
  EXPECT_NE(msg.find("request: 40.00 MiB (41943040 bytes) on sim, stream 0x77"), std::string::npos);
  EXPECT_NE(msg.find("device: capacity 64.00 MiB, free "), std::string::npos);
  EXPECT_NE(msg.find("devrt: reserved "), std::string::npos);
  EXPECT_NE(msg.find("in use 56.00 MiB in 12 allocations"), std::string::npos);
  EXPECT_NE(msg.find("returning 0 B"), std::string::npos);
  EXPECT_NE(msg.find("held for streams"), std::string::npos);
  EXPECT_NE(msg.find("largest free block"), std::string::npos);
  EXPECT_NE(msg.find("the 10 largest live allocations (of 12):"), std::string::npos);
  // Largest first, each with its size, address, stream and reserve number.
  const auto first = msg.find(" 1.  16.00 MiB (16777216 bytes) at 0x");
  const auto second = msg.find(" 2.  12.00 MiB (12582912 bytes) at 0x");
  ASSERT_NE(first, std::string::npos);
  ASSERT_NE(second, std::string::npos);
  EXPECT_LT(first, second);
  EXPECT_NE(msg.find("stream 0x77, reserve #2 of 12"), std::string::npos);
  EXPECT_EQ(msg.find("11. "), std::string::npos) << "ten at most";
  EXPECT_NE(msg.find("hint: the live allocations and the request need more than the device has"), std::string::npos);
  EXPECT_EQ(msg.find("fragmentation"), std::string::npos) << "live memory, not fragmentation, is the cause here";
  EXPECT_EQ(m->statistics().out_of_memory_errors, 1u);
  EXPECT_EQ(m->check_invariants(), "") << "a failed reserve leaves the pools as they were";
}

TEST(OutOfMemoryReport, SaysWhenFragmentationIsTheCause) {
  // Pages of 8 MiB on a device of 32 MiB: four pages full of 1 MiB slices, every other one freed,
  // leave 16 MiB free in holes of 1 MiB; a 2 MiB request then needs a page the device has not got.
  auto m = sim_manager("sliced:page=8MiB,slice=4MiB", 32 * mib);
  std::vector<memory_handle> live;
  for (int i = 0; i < 32; ++i) live.push_back(m->reserve(mib).value());
  for (std::size_t i = 0; i < live.size(); i += 2) live[i].reset();
  auto r = m->reserve(2 * mib);
  ASSERT_EQ(r.code(), errc::out_of_memory);
  const std::string msg = r.err().message();
  SCOPED_TRACE(msg);
  EXPECT_NE(msg.find("free in its pools 16.00 MiB (largest free block 1.00 MiB)"), std::string::npos);
  EXPECT_NE(msg.find("hint: fragmentation, not the live size"), std::string::npos);
  const memory_snapshot s = m->snapshot();
  EXPECT_EQ(s.check(), "");
}

TEST(OutOfMemoryReport, IsRecordedInTheTraceWithTheDevicesFreeBytes) {
  auto m = sim_manager("arena", 16 * mib);
  m->record_history(true, 100);
  auto a = m->reserve(10 * mib).value();
  ASSERT_EQ(m->reserve(10 * mib).code(), errc::out_of_memory);
  const memory_snapshot s = m->snapshot();
  ASSERT_EQ(count(s.trace, trace_action::oom), 1u);
  for (const auto& e : s.trace) {
    if (e.action != trace_action::oom) continue;
    EXPECT_EQ(e.size, 10 * mib);
    EXPECT_EQ(e.device_free, 16 * mib - s.statistics.bytes_reserved - s.statistics.bytes_returning);
  }
}
