// Unmaps on a device that runs work in queue order (a simulated GPU with deferred unmaps): the
// arena lets an unmap reach the device before it maps memory elsewhere, so that a device with
// nothing left to run takes the memory back at once and the peak of memory held counts it only
// once; behind busy queues the memory stays on its way back (counted) until their work has passed.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "devrt/devices/sim_storage.hpp"
#include "devrt/memory/memory_manager.hpp"

using namespace devrt;
using namespace devrt::memory;

namespace {

// The device's own stream: frees are reused at once, as on a device used by one stream.
constexpr stream_id stream_a = streams::device;
constexpr std::uint64_t mib = 1ULL << 20;

struct device {
  devices::sim_storage* sim = nullptr;
  std::unique_ptr<memory_manager> m;

  explicit device(bool deferred, std::uint64_t capacity = 0) {
    devices::sim_options o;
    o.props.capacity = capacity;
    o.streams = true;
    o.deferred_unmaps = deferred;
    o.props.map_granularity = 2 * mib;
    auto store = storage::make<devices::sim_storage>(o);
    sim = store.backend<devices::sim_storage>();
    m = std::make_unique<memory_manager>(std::move(store), manager_options{});
  }
};

// One arena of 256 MiB without the growth policy, under a memory limit, on a device with deferred
// unmaps.
struct limited_arena {
  devices::sim_storage* sim = nullptr;
  std::unique_ptr<memory_manager> m;

  explicit limited_arena(std::uint64_t limit) {
    devices::sim_options o;
    o.streams = true;
    o.deferred_unmaps = true;
    o.props.map_granularity = 2 * mib;
    auto store = storage::make<devices::sim_storage>(o);
    sim = store.backend<devices::sim_storage>();
    manager_options opts;
    opts.layout = parse_layout("arena:space=256MiB,grow=0").value();
    opts.memory_limit = limit;
    m = std::make_unique<memory_manager>(std::move(store), opts);
  }
};

// A and B side by side; A is dropped; C does not fit in A's hole and is mapped after B, which takes
// the memory held past the budget of free mappings: A's mapping is unmapped to make room.
struct evict_then_map {
  memory_handle b, c;
  explicit evict_then_map(device& d) {
    auto a = d.m->reserve(32 * mib, stream_a).value();
    b = d.m->reserve(32 * mib, stream_a).value();
    EXPECT_TRUE(d.m->end_batch());
    a.reset();
    EXPECT_TRUE(d.m->end_batch());
    c = d.m->reserve(48 * mib, stream_a).value();
  }
};

}  // namespace

TEST(DeferredUnmaps, OnAnIdleDeviceThePeakIsTheSameAsWithImmediateUnmaps) {
  device immediate(false);
  evict_then_map ri(immediate);
  const memory_statistics si = immediate.m->statistics();
  ASSERT_GE(si.unmaps, 1u) << "the scenario must unmap A's memory to map C's";

  device deferred(true);
  evict_then_map rd(deferred);
  const memory_statistics sd = deferred.m->statistics();
  EXPECT_EQ(sd.unmaps, si.unmaps);
  EXPECT_EQ(sd.peak_bytes_reserved, si.peak_bytes_reserved)
      << "memory on its way back was counted beside the new mapping on an idle device";
  EXPECT_EQ(sd.bytes_returning, 0u);
  EXPECT_EQ(deferred.sim->allocated_bytes(), immediate.sim->allocated_bytes());
  EXPECT_EQ(deferred.m->check_invariants(), "");
}

TEST(DeferredUnmaps, BehindBusyQueuesTheMemoryIsHeldUntilTheirWorkHasPassed) {
  device idle(true);
  evict_then_map ri(idle);
  const std::uint64_t idle_peak = idle.m->statistics().peak_bytes_reserved;

  device busy(true);
  (void)busy.sim->record_event(stream_a).value();  // work still queued on the stream
  evict_then_map rb(busy);
  const memory_statistics& s = busy.m->statistics();
  ASSERT_GE(s.unmaps, 1u);
  // A's memory is still the device's: counted as returning, and in the peak next to C's mapping.
  EXPECT_EQ(s.bytes_returning, 32 * mib);
  EXPECT_GE(s.peak_bytes_reserved, idle_peak + 32 * mib);
  const std::uint64_t held = busy.sim->allocated_bytes();
  ASSERT_TRUE(busy.m->end_batch());
  EXPECT_EQ(busy.sim->allocated_bytes(), held) << "memory went back while the queue could still use it";
  EXPECT_EQ(busy.m->statistics().bytes_returning, 32 * mib);
  busy.sim->progress();  // the queued work, and the event behind it, have passed
  ASSERT_TRUE(busy.m->end_batch());
  EXPECT_EQ(busy.m->statistics().bytes_returning, 0u);
  EXPECT_EQ(busy.sim->allocated_bytes(), held - 32 * mib);
  EXPECT_EQ(busy.sim->waits(), 0u) << "nothing waited for the device";
  EXPECT_EQ(busy.m->check_invariants(), "");
}

TEST(DeferredUnmaps, TheSameBoundsMappedAgainKeepTheirMemoryOthersWait) {
  devices::sim_options o;
  o.streams = true;
  o.deferred_unmaps = true;
  o.props.map_granularity = 2 * mib;
  devices::sim_storage s(o);
  auto range = s.reserve_range(64 * mib, 2 * mib).value();
  ASSERT_TRUE(s.map(range.id, 0, 8 * mib));
  (void)s.record_event(streams::device).value();  // busy
  s.unmap(range.id, 0, 8 * mib);
  EXPECT_EQ(s.returning_bytes(), 8 * mib);
  EXPECT_EQ(s.mapped_bytes(), 8 * mib) << "the addresses stay mapped until the unmap happens";
  ASSERT_TRUE(s.flush());
  EXPECT_EQ(s.allocated_bytes(), 8 * mib);
  // Revived: no new memory, nothing returning.
  ASSERT_TRUE(s.map(range.id, 0, 8 * mib));
  EXPECT_EQ(s.returning_bytes(), 0u);
  EXPECT_EQ(s.allocated_bytes(), 8 * mib);
  EXPECT_EQ(s.allocations(), 1u);
  // Other bounds over a pending unmap wait for it.
  s.unmap(range.id, 0, 8 * mib);
  ASSERT_TRUE(s.flush());
  ASSERT_TRUE(s.map(range.id, 0, 4 * mib));
  EXPECT_EQ(s.waits(), 1u);
  EXPECT_EQ(s.returning_bytes(), 0u);
  EXPECT_EQ(s.allocated_bytes(), 4 * mib);
  // A range released with an unmap pending gives everything back.
  s.unmap(range.id, 0, 4 * mib);
  s.release_range(range.id);
  ASSERT_TRUE(s.flush());
  EXPECT_EQ(s.allocated_bytes(), 0u);
  EXPECT_EQ(s.returning_bytes(), 0u);
  EXPECT_EQ(s.misuses(), 0u);
}

namespace {

// The same random workload of reserves and drops (sizes from 512 bytes to 96 MiB) on a device.
memory_statistics random_workload(device& d, std::uint32_t seed, bool busy) {
  std::mt19937_64 rng(seed);
  std::vector<memory_handle> live;
  std::uniform_int_distribution<int> pick(0, 99);
  for (int step = 0; step < 4000; ++step) {
    if (busy && step % 50 == 0) {
      d.sim->progress();                            // the queued work so far has run
      (void)d.sim->record_event(stream_a).value();  // and more is queued
    }
    if (live.empty() || pick(rng) < 55) {
      const int kind = pick(rng);
      const std::uint64_t size = kind < 60   ? 512 + rng() % (256 * 1024)
                                 : kind < 90 ? mib + rng() % (16 * mib)
                                             : 16 * mib + rng() % (80 * mib);
      live.push_back(d.m->reserve(size, stream_a).value());
    } else {
      const std::size_t k = rng() % live.size();
      live[k] = std::move(live.back());
      live.pop_back();
    }
    EXPECT_TRUE(d.m->end_batch());
    if (step % 500 == 0) {
      EXPECT_EQ(d.m->check_invariants(), "") << "step " << step;
    }
  }
  live.clear();
  EXPECT_TRUE(d.m->end_batch());
  EXPECT_EQ(d.m->check_invariants(), "");
  return d.m->statistics();
}

}  // namespace

TEST(DeferredUnmaps, AnIdleDeviceWithQueuesPlacesAndHoldsExactlyAsOneThatUnmapsAtOnce) {
  for (std::uint32_t seed : {1U, 2U, 3U}) {
    SCOPED_TRACE(seed);
    device immediate(false);
    device deferred(true);
    const memory_statistics a = random_workload(immediate, seed, false);
    const memory_statistics b = random_workload(deferred, seed, false);
    ASSERT_GT(a.unmaps, 0u) << "the workload must unmap to mean anything";
    EXPECT_EQ(b.maps, a.maps);
    EXPECT_EQ(b.unmaps, a.unmaps);
    EXPECT_EQ(b.peak_bytes_reserved, a.peak_bytes_reserved);
    EXPECT_EQ(deferred.sim->waits(), 0u);
  }
}

TEST(DeferredUnmaps, BehindABusyDeviceNothingWaitsAndEverythingComesBack) {
  device d(true);
  const memory_statistics s = random_workload(d, 7, true);
  EXPECT_GT(s.unmaps, 0u);
  EXPECT_EQ(d.sim->waits(), 0u) << "a map waited for the device";
  EXPECT_EQ(d.sim->misuses(), 0u);
  d.sim->progress();
  ASSERT_TRUE(d.m->end_batch());
  EXPECT_EQ(d.m->statistics().bytes_returning, 0u);
  EXPECT_EQ(d.sim->allocated_bytes(), d.m->statistics().bytes_reserved);
}

// What a pool may map again with other bounds: only unmaps the device has not done yet count as in
// flight. Memory that is on its way back for another reason (a queued page) does not keep the
// arena from forgetting the bounds of what it unmapped.
TEST(DeferredUnmaps, OnlyUnmapsNotYetDoneAreInFlight) {
  devices::sim_options o;
  o.streams = true;
  o.deferred_unmaps = true;
  o.props.map_granularity = 2 * mib;
  auto st = storage::make<devices::sim_storage>(o);
  auto* sim = st.backend<devices::sim_storage>();
  const storage_handle range = st.reserve_range(16 * mib, 2 * mib).value();
  ASSERT_TRUE(st.map(range.id, 0, 4 * mib));
  const event busy = st.record_event(streams::device).value();  // work queued that may use the mapping
  st.unmap(range.id, 0, 4 * mib);
  ASSERT_TRUE(st.flush());
  EXPECT_EQ(st.unmaps_in_flight(), 1u);
  EXPECT_EQ(st.returning_bytes(), 4 * mib);
  sim->run_until(busy);  // the unmap was recorded behind the flush, later than `busy`
  EXPECT_EQ(st.unmaps_in_flight(), 1u);
  sim->run_until(st.record_event(streams::device).value());
  ASSERT_TRUE(st.flush());
  EXPECT_EQ(st.unmaps_in_flight(), 0u);
  EXPECT_EQ(st.returning_bytes(), 0u);

  // A page given back but not flushed yet is returning, not an unmap in flight.
  const storage_handle page = st.alloc(1 * mib).value();
  st.dealloc(page.id);
  EXPECT_EQ(st.returning_bytes(), 1 * mib);
  EXPECT_EQ(st.unmaps_in_flight(), 0u);
  ASSERT_TRUE(st.flush());
  st.release_range(range.id);
}

// Review finding B10: a range released while an unmap of it could not be recorded (or was still in
// flight) was freed at once, unmapping memory without any event. It keeps its addresses until its
// unmaps are done, and a failed record leaves everything for the next flush.
TEST(DeferredUnmaps, AReleasedRangeKeepsItsMemoryUntilItsUnmapsAreDone) {
  devices::sim_options o;
  o.streams = true;
  o.deferred_unmaps = true;
  o.props.map_granularity = 2 * mib;
  devices::sim_storage s(o);
  int given_back = 0;
  s.on_give_back = [&](const devices::sim_storage::given_back&) { ++given_back; };
  auto range = s.reserve_range(64 * mib, 2 * mib).value();
  ASSERT_TRUE(s.map(range.id, 0, 4 * mib));
  const event busy = s.record_event(streams::device).value();  // work that may use the mapping
  s.release_range(range.id);
  s.fail_next_record();
  EXPECT_FALSE(s.flush()) << "the failed record is reported";
  EXPECT_EQ(given_back, 0) << "memory went back without an event behind the work queued";
  EXPECT_EQ(s.range_count(), 1u);
  ASSERT_TRUE(s.flush());  // recorded now, behind the busy work
  EXPECT_EQ(given_back, 0);
  EXPECT_EQ(s.range_count(), 1u) << "the range's addresses went while its unmap was in flight";
  EXPECT_EQ(s.returning_bytes(), 4 * mib);
  s.run_until(busy);
  s.progress();
  ASSERT_TRUE(s.flush());
  EXPECT_EQ(given_back, 1);
  EXPECT_EQ(s.range_count(), 0u);
  EXPECT_EQ(s.allocated_bytes(), 0u);
}

// Far from the device's budget, behind a device still busy with an earlier unmap, the arena keeps
// its free mappings: an unmap then lowers nothing before the queued work has passed, and a later map
// at those addresses would only revive it. Once the device has caught up, the budget applies again.
TEST(DeferredUnmaps, BehindAnUnmapInFlightFreeMemoryStaysMappedUntilTheDeviceCaughtUp) {
  device d(true, devices::sim_options::h200().props.capacity);  // far from its budget
  constexpr std::uint64_t gib = 1024 * mib;
  const event busy = d.sim->record_event(stream_a).value();  // work queued: unmaps wait behind it
  auto x = d.m->reserve(1 * gib, stream_a).value();
  auto y = d.m->reserve(1 * gib, stream_a).value();
  ASSERT_TRUE(d.m->end_batch());
  x.reset();
  ASSERT_TRUE(d.m->end_batch());
  // Z does not fit in X's hole: X's memory is unmapped to keep the budget, behind the busy work.
  auto z = d.m->reserve(3 * gib / 2, stream_a).value();
  ASSERT_TRUE(d.m->end_batch());
  const std::uint64_t first_unmaps = d.m->statistics().unmaps;
  ASSERT_GT(first_unmaps, 0u);
  ASSERT_GT(d.sim->unmaps_in_flight(), 0u);
  // Y is dropped and W fits nowhere mapped: the budget would unmap Y's memory too, but the first
  // unmaps are still in flight.
  y.reset();
  ASSERT_TRUE(d.m->end_batch());
  auto w = d.m->reserve(5 * gib / 2, stream_a).value();
  EXPECT_EQ(d.m->statistics().unmaps, first_unmaps) << "free memory was unmapped behind unmaps still in flight";
  EXPECT_EQ(d.m->check_invariants(), "");
  // The device catches up: the next map applies the budget again.
  d.sim->run_until(busy);
  d.sim->progress();
  ASSERT_TRUE(d.m->end_batch());
  ASSERT_EQ(d.sim->unmaps_in_flight(), 0u);
  auto v = d.m->reserve(4 * gib, stream_a).value();
  EXPECT_GT(d.m->statistics().unmaps, first_unmaps) << "the budget no longer applies once the device caught up";
  EXPECT_EQ(d.m->check_invariants(), "");
  EXPECT_EQ(d.sim->waits(), 0u);
}

// Memory the idle device took back from an eviction is kept for the next map (kept_bytes), and
// counts as held until a map takes or releases it. A map under the memory limit releases what it
// does not take before it takes new memory, so the limit must not count both: the map fits.
TEST(DeferredUnmaps, AMapUnderTheLimitDoesNotCountTheKeptMemoryItReleasesFirst) {
  limited_arena d(10 * mib);
  devices::sim_storage* sim = d.sim;
  memory_manager& m = *d.m;

  auto a = m.reserve(6 * mib, stream_a).value();      // granules 0..2, one mapping
  auto guard = m.reserve(2 * mib, stream_a).value();  // granule 3
  EXPECT_TRUE(m.end_batch());
  a.reset();
  EXPECT_TRUE(m.end_batch());
  ASSERT_EQ(m.statistics().bytes_reserved, 8 * mib) << "A's free mapping stays mapped";

  // 8 MiB does not fit A's hole: granules 4..7, after A's 6 MiB go back (kept by the device).
  auto b = m.reserve(8 * mib, stream_a);
  ASSERT_TRUE(b) << b.err().message();
  EXPECT_EQ(m.statistics().bytes_reserved, 10 * mib);
  EXPECT_LE(m.statistics().peak_bytes_reserved, 10 * mib) << "the kept memory and the new mapping never both";
  EXPECT_TRUE(m.end_batch());
  EXPECT_EQ(sim->kept_bytes(), 0u);
  EXPECT_EQ(sim->mapped_bytes(), 10 * mib);
  EXPECT_EQ(m.check_invariants(), "");
}

// Far from the budget the arena maps ahead where it grows; where the slice's last granule was
// mapped already, what it maps ahead is a mapping of its own that no slice uses, and it belongs on
// the free list (found by the main job on the simulated H200). Random reserves and drops on an
// ordered device with the room of an H200, the pools' invariants checked after every step.
TEST(DeferredUnmaps, MemoryMappedAheadIsAlwaysFreeOrUsed) {
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    device d(true, 141ULL << 30);
    std::mt19937_64 rng(seed);
    std::vector<memory_handle> live;
    for (int step = 0; step < 1500; ++step) {
      if (!live.empty() && rng() % 100 < 48) {
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(rng() % live.size()));
      } else {
        const std::uint64_t size = (rng() % 4 == 0 ? (1 + rng() % 96) * mib : 1 + rng() % (3 * mib)) + rng() % 4096;
        live.push_back(d.m->reserve(size, stream_a).value());
      }
      if (step % 7 == 0) {
        EXPECT_TRUE(d.m->end_batch());
      }
      const std::string problem = d.m->check_invariants();
      ASSERT_EQ(problem, "") << "seed " << seed << ", step " << step;
    }
  }
}

// Under a memory limit, a reserve whose new memory cannot fit maps nothing: it fails without a
// driver call, leaves nothing on its way back for a reclaim to wait for, and the memory held never
// rises toward the limit on its account.
TEST(DeferredUnmaps, UnderTheLimitAReserveThatCannotFitMapsNothing) {
  limited_arena d(48 * mib);
  memory_manager& m = *d.m;

  auto a = m.reserve(32 * mib, stream_a).value();
  auto guard = m.reserve(2 * mib, stream_a).value();
  EXPECT_TRUE(m.end_batch());
  const memory_statistics before = m.statistics();
  ASSERT_EQ(before.bytes_reserved, 34 * mib);

  // 40 MiB more would take 74 MiB past the 48 MiB limit.
  auto refused = m.reserve(40 * mib, stream_a);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.code(), errc::out_of_memory);
  EXPECT_NE(refused.err().message().find("memory limit"), std::string::npos) << refused.err().message();
  const memory_statistics& after = m.statistics();
  EXPECT_EQ(after.maps, before.maps) << "a reserve bound to fail mapped memory";
  EXPECT_EQ(after.unmaps, before.unmaps);
  EXPECT_EQ(after.bytes_returning, 0u);
  EXPECT_EQ(after.peak_bytes_reserved, before.peak_bytes_reserved);

  // What fits still maps: 14 MiB is the room left.
  auto fits = m.reserve(14 * mib, stream_a);
  ASSERT_TRUE(fits) << fits.err().message();
  EXPECT_LE(m.statistics().bytes_reserved, 48 * mib);
  EXPECT_EQ(m.check_invariants(), "");
}

// Under a memory limit, memory on its way back behind a busy device counts against the limit.
// Out of memory, the reclaim waits for the device (memory pressure, the one place it waits) so
// that the retry finds that memory gone: the reserve succeeds, where without the wait it failed
// although nothing but queued work held the memory.
TEST(DeferredUnmaps, AReclaimUnderTheLimitWaitsForMemoryOnItsWayBack) {
  limited_arena d(48 * mib);
  devices::sim_storage* sim = d.sim;
  memory_manager& m = *d.m;

  auto a = m.reserve(32 * mib, stream_a).value();
  auto guard = m.reserve(2 * mib, stream_a).value();  // keeps A's hole apart from the free end
  EXPECT_TRUE(m.end_batch());
  (void)sim->record_event(stream_a).value();  // work still queued on the stream, which may use A
  a.reset();
  ASSERT_TRUE(m.cleanup(true));
  ASSERT_EQ(m.statistics().bytes_returning, 32 * mib) << "A's memory waits behind the queued work";

  // 40 MiB fits neither A's hole nor, with A's memory still held, the limit.
  auto refused = m.reserve(40 * mib, stream_a);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.code(), errc::out_of_memory);
  const std::uint64_t waits = m.statistics().stream_waits;
  ASSERT_TRUE(m.reclaim());
  EXPECT_EQ(m.statistics().stream_waits, waits + 1) << "the reclaim waited for the device, once, counted";
  EXPECT_EQ(m.statistics().bytes_returning, 0u);
  auto b = m.reserve(40 * mib, stream_a);
  ASSERT_TRUE(b) << b.err().message();
  EXPECT_LE(m.statistics().bytes_reserved, 48 * mib);
  EXPECT_EQ(m.check_invariants(), "");
}

// With streams of its own, devrt knows which free memory no queued work can reach: every free is
// fenced on its stream, and memory comes back for every stream only once that fence has passed.
// Such a free mapping goes back at once, even behind another stream's busy queue, and the peak
// never counts it beside the mapping that replaces it.
TEST(DeferredUnmaps, MemoryEveryStreamHasPassedGoesBackAtOnceBehindBusyQueues) {
  device d(true);
  devices::sim_storage* sim = d.sim;
  memory_manager& m = *d.m;
  const stream_id x = sim->create_stream();
  const stream_id y = sim->create_stream();

  auto a = m.reserve(32 * mib, x).value();
  auto b = m.reserve(32 * mib, x).value();
  ASSERT_TRUE(m.end_batch());
  (void)sim->record_event(y).value();  // another stream's work, still queued
  a.reset();                           // A's free is fenced on X
  ASSERT_TRUE(m.end_batch());
  sim->progress_stream(x);  // X has passed A's fence; Y is still busy
  const std::uint64_t unmaps = m.statistics().unmaps;

  // C fits not A's hole: it is mapped after B, and A's mapping goes back to make room.
  auto c = m.reserve(48 * mib, x).value();
  const memory_statistics& s = m.statistics();
  ASSERT_GT(s.unmaps, unmaps) << "the scenario must unmap A's mapping to map C's";
  EXPECT_EQ(s.bytes_returning, 0u) << "memory no queued work can reach waited behind Y's queue";
  EXPECT_EQ(s.peak_bytes_reserved, s.bytes_reserved) << "A's memory was counted beside C's";
  EXPECT_EQ(sim->allocated_bytes(), s.bytes_reserved);
  EXPECT_EQ(sim->waits(), 0u) << "nothing waited for the device";
  EXPECT_EQ(m.check_invariants(), "");
}

// Memory freed at once while the device's own stream was the only one (no fence) may still be used
// by that stream's queued work after a second stream comes, until the fence recorded then has
// passed: its unmap waits behind the queue as before.
TEST(DeferredUnmaps, MemoryFreedBeforeASecondStreamCameWaitsForTheTransitionFence) {
  device d(true);
  devices::sim_storage* sim = d.sim;
  memory_manager& m = *d.m;

  auto a = m.reserve(32 * mib, stream_a).value();
  auto b = m.reserve(32 * mib, stream_a).value();
  ASSERT_TRUE(m.end_batch());
  (void)sim->record_event(stream_a).value();  // work still queued on the stream, which may use A
  a.reset();                                  // one stream so far: free at once, no fence
  ASSERT_TRUE(m.end_batch());
  const std::uint64_t unmaps = m.statistics().unmaps;
  // A second stream: frees carry their stream from now on (A's does not). Its 40 MiB fit not A's
  // hole: mapped after B, and A's mapping goes back to make room.
  const stream_id x = sim->create_stream();
  auto c = m.reserve(40 * mib, x).value();
  ASSERT_GT(m.statistics().unmaps, unmaps) << "the scenario must unmap A's mapping to map C's";
  const std::uint64_t held = sim->allocated_bytes();
  EXPECT_EQ(m.statistics().bytes_returning, 32 * mib) << "A's memory went back while the queue could still use it";
  ASSERT_TRUE(m.end_batch());
  EXPECT_EQ(sim->allocated_bytes(), held);
  sim->progress();  // the queued work, and the fence behind it, have passed
  ASSERT_TRUE(m.end_batch());
  EXPECT_EQ(m.statistics().bytes_returning, 0u);
  EXPECT_EQ(sim->allocated_bytes(), held - 32 * mib);
  EXPECT_EQ(m.check_invariants(), "");
}
