// Fault injection and introspection of the simulated device, alone and under a memory manager;
// and the host backend's constructor validation.

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "devrt/devices/host_storage.hpp"
#include "devrt/devices/sim_storage.hpp"
#include "devrt/memory/memory_manager.hpp"

namespace {

using devrt::errc;
using devrt::devices::sim_options;
using devrt::devices::sim_storage;
using devrt::memory::storage_handle;

constexpr std::uint64_t kib = 1024;
constexpr std::uint64_t mib = 1024 * kib;

sim_options small_sim(std::uint64_t capacity = 0) {
  sim_options o;
  o.props = {128ULL << 20, 32, capacity};
  return o;
}

bool mentions(const char* detail, const std::string& word) {
  return std::string(detail).find(word) != std::string::npos;
}

TEST(SimStorageFaults, FailAllocationFailsExactlyTheNthAllocation) {
  sim_storage s(small_sim());
  s.fail_allocation(3);
  auto a1 = s.alloc(100);
  auto a2 = s.alloc(200);
  ASSERT_TRUE(a1);
  ASSERT_TRUE(a2);
  auto a3 = s.alloc(300);
  ASSERT_FALSE(a3) << "the 3rd allocation from now must fail";
  EXPECT_EQ(a3.code(), errc::out_of_memory);
  EXPECT_TRUE(mentions(a3.err().detail, "injected")) << a3.err().detail;
  EXPECT_EQ(a3.err().size, 300u);
  // Later allocations succeed: the failure is injected once.
  for (int i = 0; i < 10; ++i) {
    auto r = s.alloc(300);
    EXPECT_TRUE(r) << "allocation " << i << " after the injected failure";
  }
  EXPECT_EQ(s.allocations(), 12u);
  EXPECT_EQ(s.alloc_calls(), 13u);
  EXPECT_EQ(s.page_count(), 12u);
  EXPECT_EQ(s.allocated_bytes(), 100u + 200u + 10 * 300u) << "the failed allocation must not count";
}

TEST(SimStorageFaults, FailAllocationCountsFromNow) {
  sim_storage s(small_sim());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(s.alloc(64));
  s.fail_allocation(1);  // the very next one
  auto r = s.alloc(64);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.code(), errc::out_of_memory);
  EXPECT_TRUE(mentions(r.err().detail, "injected")) << r.err().detail;
  EXPECT_TRUE(s.alloc(64));
  // A second injection replaces nothing that already fired, and counts from its own call.
  s.fail_allocation(2);
  EXPECT_TRUE(s.alloc(64));
  EXPECT_EQ(s.alloc(64).code(), errc::out_of_memory);
  EXPECT_TRUE(s.alloc(64));
}

TEST(SimStorageFaults, FailNextFlushKeepsTheQueue) {
  sim_storage s(small_sim());
  auto a = s.alloc(4 * kib);
  auto b = s.alloc(8 * kib);
  ASSERT_TRUE(a);
  ASSERT_TRUE(b);
  s.dealloc(a->id);
  s.dealloc(b->id);
  s.fail_next_flush();
  auto f = s.flush();
  ASSERT_FALSE(f) << "the injected flush failure did not fire";
  EXPECT_EQ(f.code(), errc::device_error);
  EXPECT_TRUE(mentions(f.err().detail, "injected")) << f.err().detail;
  // Nothing was freed and the queue is kept.
  EXPECT_EQ(s.pending_deallocations(), 2u);
  EXPECT_EQ(s.frees(), 0u);
  EXPECT_EQ(s.page_count(), 2u);
  EXPECT_EQ(s.allocated_bytes(), 12 * kib);
  EXPECT_TRUE(s.get(*a));
  // The second flush succeeds and frees both.
  auto f2 = s.flush();
  ASSERT_TRUE(f2) << f2.err().message();
  EXPECT_EQ(s.pending_deallocations(), 0u);
  EXPECT_EQ(s.frees(), 2u);
  EXPECT_EQ(s.page_count(), 0u);
  EXPECT_EQ(s.allocated_bytes(), 0u);
  EXPECT_EQ(s.get(*a).code(), errc::not_found);
  EXPECT_EQ(s.get(*b).code(), errc::not_found);
  // Only the next flush fails.
  EXPECT_TRUE(s.flush());
}

TEST(SimStorageFaults, CapacityCountsPagesQueuedButNotFlushed) {
  sim_storage s(small_sim(100 * kib));
  auto a = s.alloc(60 * kib);
  ASSERT_TRUE(a);
  s.dealloc(a->id);
  // The page is queued, not yet returned: the device still holds it.
  auto b = s.alloc(60 * kib);
  ASSERT_FALSE(b) << "a queued page's bytes were counted as free before the flush";
  EXPECT_EQ(b.code(), errc::out_of_memory);
  EXPECT_EQ(b.err().size, 60 * kib);
  EXPECT_EQ(b.err().in_use, 60 * kib);
  EXPECT_EQ(b.err().limit, 100 * kib);
  EXPECT_FALSE(mentions(b.err().detail, "injected")) << b.err().detail;
  ASSERT_TRUE(s.flush());
  auto c = s.alloc(60 * kib);
  ASSERT_TRUE(c) << c.err().message();
}

TEST(SimStorageFaults, SetCapacityBelowWhatIsAllocated) {
  sim_storage s(small_sim());
  auto a = s.alloc(1 * mib);
  ASSERT_TRUE(a);
  s.set_capacity(512 * kib);
  EXPECT_EQ(s.properties().capacity, 512 * kib);
  EXPECT_EQ(s.alloc(0).code(), errc::out_of_memory) << "over capacity: even a zero-size page is refused";
  EXPECT_EQ(s.alloc(1).code(), errc::out_of_memory);
  s.dealloc(a->id);
  ASSERT_TRUE(s.flush());
  EXPECT_TRUE(s.alloc(512 * kib));
}

TEST(SimStorageFaults, Counters) {
  sim_storage s(small_sim());
  EXPECT_EQ(s.allocations(), 0u);
  EXPECT_EQ(s.frees(), 0u);
  EXPECT_EQ(s.peak_allocated_bytes(), 0u);
  std::vector<storage_handle> pages;
  for (std::uint64_t i = 1; i <= 4; ++i) {
    auto r = s.alloc(i * kib);
    ASSERT_TRUE(r);
    pages.push_back(*r);
  }
  EXPECT_EQ(s.allocations(), 4u);
  EXPECT_EQ(s.allocated_bytes(), 10 * kib);
  EXPECT_EQ(s.peak_allocated_bytes(), 10 * kib);
  s.dealloc(pages[3].id);
  s.dealloc(pages[2].id);
  EXPECT_EQ(s.frees(), 0u) << "a dealloc only queues";
  ASSERT_TRUE(s.flush());
  EXPECT_EQ(s.frees(), 2u);
  EXPECT_EQ(s.allocated_bytes(), 3 * kib);
  EXPECT_EQ(s.peak_allocated_bytes(), 10 * kib) << "the peak does not go down";
  ASSERT_TRUE(s.alloc(2 * kib));
  EXPECT_EQ(s.peak_allocated_bytes(), 10 * kib);
  ASSERT_TRUE(s.alloc(20 * kib));
  EXPECT_EQ(s.peak_allocated_bytes(), 25 * kib);
  EXPECT_EQ(s.allocations(), 6u);
  // Failed allocations are calls, not allocations.
  s.fail_allocation(1);
  EXPECT_FALSE(s.alloc(1));
  EXPECT_EQ(s.allocations(), 6u);
  EXPECT_EQ(s.alloc_calls(), 7u);
  // Deallocating an id twice frees it once.
  s.dealloc(pages[0].id);
  s.dealloc(pages[0].id);
  ASSERT_TRUE(s.flush());
  EXPECT_EQ(s.frees(), 3u);
}

// ---- Through a memory manager ----

TEST(SimStorageFaults, ManagerSurvivesAnInjectedAllocationFailure) {
  namespace mem = devrt::memory;
  mem::memory_manager m(mem::storage::make<sim_storage>(small_sim()), mem::manager_options{});
  auto* sim = m.backing_storage().backend<sim_storage>();
  ASSERT_NE(sim, nullptr);

  auto first = m.reserve(1000);
  ASSERT_TRUE(first) << first.err().message();
  const std::uint64_t allocs_before = sim->allocations();

  // A size that no existing page can serve, so the reserve has to ask the device.
  sim->fail_allocation(1);
  auto r = m.reserve(20 * mib);
  ASSERT_FALSE(r) << "the injected failure did not reach the reserve";
  EXPECT_EQ(r.code(), errc::out_of_memory);
  EXPECT_TRUE(mentions(r.err().detail, "injected")) << r.err().detail;
  EXPECT_EQ(m.check_invariants(), "");
  EXPECT_EQ(m.statistics().out_of_memory, 1u);
  EXPECT_EQ(m.statistics().failed_reserves, 1u);
  EXPECT_EQ(sim->allocations(), allocs_before);
  const auto u = m.usage();
  EXPECT_EQ(u.number_allocs, 1u) << "the failed reserve left a live allocation behind";
  EXPECT_EQ(u.bytes_in_use, 1000u);

  // A retry succeeds.
  auto retry = m.reserve(20 * mib);
  ASSERT_TRUE(retry) << retry.err().message();
  auto st = m.get_storage(*retry);
  ASSERT_TRUE(st);
  EXPECT_EQ(st->size, 20 * mib);
  EXPECT_EQ(m.check_invariants(), "");
  EXPECT_EQ(m.statistics().out_of_memory, 1u);
  EXPECT_EQ(m.usage().number_allocs, 2u);
}

TEST(SimStorageFaults, ManagerPersistentReserveSurvivesAnInjectedFailure) {
  namespace mem = devrt::memory;
  mem::memory_manager m(mem::storage::make<sim_storage>(small_sim()), mem::manager_options{});
  auto* sim = m.backing_storage().backend<sim_storage>();
  ASSERT_NE(sim, nullptr);
  m.mode(mem::allocation_mode::persistent);
  sim->fail_allocation(1);
  auto r = m.reserve(4096);
  EXPECT_EQ(r.code(), errc::out_of_memory);
  EXPECT_EQ(m.check_invariants(), "");
  EXPECT_EQ(m.statistics().out_of_memory, 1u);
  EXPECT_EQ(m.usage().number_allocs, 0u);
  auto retry = m.reserve(4096);
  ASSERT_TRUE(retry) << retry.err().message();
  EXPECT_EQ(m.check_invariants(), "");
}

TEST(SimStorageFaults, ManagerFlushFailureKeepsPagesQueued) {
  namespace mem = devrt::memory;
  mem::memory_manager m(mem::storage::make<sim_storage>(small_sim()), mem::manager_options{});
  auto* sim = m.backing_storage().backend<sim_storage>();
  ASSERT_NE(sim, nullptr);
  {
    auto h = m.reserve(1000);
    ASSERT_TRUE(h);
  }
  sim->fail_next_flush();
  auto c = m.cleanup(true);
  EXPECT_EQ(c.code(), errc::device_error);
  EXPECT_EQ(m.check_invariants(), "");
  EXPECT_GT(sim->pending_deallocations(), 0u);
  EXPECT_TRUE(m.flush());
  EXPECT_EQ(sim->pending_deallocations(), 0u);
  EXPECT_EQ(sim->page_count(), 0u);
  EXPECT_EQ(m.check_invariants(), "");
}

TEST(HostStorageOptions, AlignmentNotAPowerOfTwoThrows) {
  devrt::devices::host_options o;
  o.alignment = 48;
  try {
    devrt::devices::host_storage s(o);
    FAIL() << "host_storage accepted alignment 48";
  } catch (const devrt::exception& e) {
    EXPECT_EQ(e.code(), errc::invalid_argument);
    EXPECT_EQ(e.err().size, 48u);
  }
  o.alignment = 0;
  EXPECT_THROW(devrt::devices::host_storage{o}, devrt::exception);
  o.alignment = 128;
  EXPECT_NO_THROW(devrt::devices::host_storage{o});
}

}  // namespace
