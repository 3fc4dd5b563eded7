// Unmaps on a device that runs work in queue order (a simulated GPU with deferred unmaps): the
// arena lets an unmap reach the device before it maps memory elsewhere, so that a device with
// nothing left to run takes the memory back at once and the peak of memory held counts it only
// once; behind busy queues the memory stays on its way back (counted) until their work has passed.
#include <gtest/gtest.h>

#include <memory>

#include "devrt/devices/sim_storage.hpp"
#include "devrt/memory/memory_manager.hpp"

using namespace devrt;
using namespace devrt::memory;

namespace {

constexpr queue_id stream_a = 0x1000;
constexpr std::uint64_t mib = 1ULL << 20;

struct device {
  devices::sim_storage* sim = nullptr;
  std::unique_ptr<memory_manager> m;

  explicit device(bool deferred) {
    devices::sim_options o;
    o.queues = true;
    o.deferred_unmaps = deferred;
    o.props.map_granularity = 2 * mib;
    auto store = storage::make<devices::sim_storage>(o);
    sim = store.backend<devices::sim_storage>();
    m = std::make_unique<memory_manager>(std::move(store), manager_options{});
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
  (void)busy.sim->mark(stream_a).value();  // work still queued on the stream
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
  busy.sim->progress();  // the queued work, and the ticket behind it, have passed
  ASSERT_TRUE(busy.m->end_batch());
  EXPECT_EQ(busy.m->statistics().bytes_returning, 0u);
  EXPECT_EQ(busy.sim->allocated_bytes(), held - 32 * mib);
  EXPECT_EQ(busy.sim->waits(), 0u) << "nothing waited for the device";
  EXPECT_EQ(busy.m->check_invariants(), "");
}

TEST(DeferredUnmaps, TheSameBoundsMappedAgainKeepTheirMemoryOthersWait) {
  devices::sim_options o;
  o.queues = true;
  o.deferred_unmaps = true;
  o.props.map_granularity = 2 * mib;
  devices::sim_storage s(o);
  auto range = s.reserve_range(64 * mib, 2 * mib).value();
  ASSERT_TRUE(s.map(range.id, 0, 8 * mib));
  (void)s.mark(queue::device).value();  // busy
  s.unmap(range.id, 0, 8 * mib);
  EXPECT_EQ(s.returning_bytes(), 8 * mib);
  EXPECT_EQ(s.mapped_bytes(), 0u);
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
