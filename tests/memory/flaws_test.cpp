// Regression tests for the known flaws of the reference implementation that devrt fixes. Each
// test states the original behaviour it would have caught.
#include <gtest/gtest.h>

#include "devrt/devices/sim_storage.hpp"
#include "devrt/memory/memory_manager.hpp"

using namespace devrt;
using namespace devrt::memory;

namespace {

struct fixture {
  devices::sim_storage* sim = nullptr;
  std::unique_ptr<memory_manager> m;
};

fixture make(std::vector<pool_config> pools, std::uint64_t alignment,
             persistent_policy policy = persistent_policy::enabled) {
  devices::sim_options o;
  o.props = {128ULL << 20, alignment, 0};
  auto backend = std::make_unique<devices::sim_storage>(o);
  fixture f;
  f.sim = backend.get();
  f.m = std::make_unique<memory_manager>(storage(std::move(backend)),
                                         manager_options{"flaws", memory_layout(std::move(pools)), policy, {}});
  return f;
}

}  // namespace

// Original: a lone free slice kept its old padding and the fit test compared the request with the
// size alone, so after a smaller request reused it the slices no longer summed to the page and the
// page could never be released. Scenario from the reference notes: 4096 B page, align 512,
// 3 x 1000 B, free the middle one, reserve 512 B.
TEST(Flaws, PaddedFreeSliceIsReusedAndPageStillReleased) {
  auto f = make({sliced_pool_config{4096, std::nullopt, std::nullopt, std::nullopt}}, 512);
  auto a = f.m->reserve(1000).value();
  auto b = f.m->reserve(1000).value();
  auto c = f.m->reserve(1000).value();
  const auto b_offset = f.m->get_storage(b)->offset;
  b.reset();
  // Same-size request with padding reuses the freed slice (the original could not).
  auto b2 = f.m->reserve(1000).value();
  EXPECT_EQ(f.m->get_storage(b2)->offset, b_offset);
  b2.reset();
  auto d = f.m->reserve(512).value();
  EXPECT_EQ(f.m->get_storage(d)->offset, b_offset);
  EXPECT_EQ(f.m->check_invariants(), "");
  a.reset();
  c.reset();
  d.reset();
  ASSERT_TRUE(f.m->cleanup(true));
  EXPECT_EQ(f.m->usage().bytes_reserved, 0u);
  EXPECT_EQ(f.sim->allocated_bytes(), 0u);
  EXPECT_EQ(f.m->check_invariants(), "");
}

// Original: persistent reuse kept the padding of the first allocation, so usage drifted
// (1025 -> padding 3; reuse by 1026 reported 1026 + 3) and the slice was re-keyed under the
// wrong size at the next cleanup.
TEST(Flaws, PersistentReuseRefreshesPadding) {
  auto f = make({sliced_pool_config{1 << 20, std::nullopt, std::nullopt, std::nullopt}}, 4);
  f.m->mode(allocation_mode::persistent);
  auto h = f.m->reserve(1025).value();
  auto u = f.m->usage();
  EXPECT_EQ(u.bytes_padding, 3u);
  EXPECT_EQ(u.bytes_reserved, 1028u);
  h.reset();
  auto h2 = f.m->reserve(1026).value();
  u = f.m->usage();
  EXPECT_EQ(u.bytes_in_use, 1026u);
  EXPECT_EQ(u.bytes_padding, 2u);
  EXPECT_EQ(u.bytes_reserved, 1028u);
  EXPECT_EQ(f.sim->page_count(), 1u);
  // The slice is still found under its size after a cleanup.
  ASSERT_TRUE(f.m->cleanup(true));
  h2.reset();
  auto h3 = f.m->reserve(1027).value();
  EXPECT_EQ(f.sim->allocations(), 1u);
  EXPECT_EQ(f.m->check_invariants(), "");
}

// Original: the exclusive pool picked the free page with the lowest "free count" (pages reused
// often have low counts), not the smallest page that fits, so a small request could take a large
// page while a small free page sat idle.
TEST(Flaws, ExclusivePoolReusesTheSmallestFittingPage) {
  auto f = make({exclusive_pool_config{1 << 20, std::nullopt}}, 512);
  auto big = f.m->reserve(1 << 20).value();
  const auto big_page = f.m->get_storage(big)->id;
  // Reuse the big page several times: in the original its free count drops to 0.
  for (int i = 0; i < 4; ++i) {
    big.reset();
    big = f.m->reserve(1 << 20).value();
    ASSERT_EQ(f.m->get_storage(big)->id, big_page);
  }
  auto small = f.m->reserve(1024).value();
  const auto small_page = f.m->get_storage(small)->id;
  ASSERT_NE(small_page, big_page);
  big.reset();
  small.reset();
  auto again = f.m->reserve(1024).value();
  EXPECT_EQ(f.m->get_storage(again)->id, small_page);
  EXPECT_EQ(f.m->check_invariants(), "");
}

// Original: a sliced pool's dealloc_period was accepted and silently ignored; sliced pages were
// only ever returned by an explicit cleanup.
TEST(Flaws, SlicedDeallocPeriodReleasesIdlePages) {
  auto f = make({sliced_pool_config{4096, std::nullopt, std::nullopt, 10},
                 sliced_pool_config{1 << 20, std::nullopt, std::nullopt, std::nullopt}},
                512);
  auto first = f.m->reserve(4096).value();
  auto second = f.m->reserve(4096).value();
  EXPECT_EQ(f.m->usage().bytes_reserved, 8192u);
  first.reset();
  second.reset();
  // Keep reserving from the other pool: the idle pages of the first pool are returned once they
  // stayed idle over a whole period, without an explicit cleanup.
  std::vector<memory_handle> other;
  for (int i = 0; i < 40; ++i) other.push_back(f.m->reserve(8192).value());
  const auto u = f.m->usage();
  EXPECT_EQ(u.bytes_reserved, std::uint64_t{1} << 20);
  EXPECT_EQ(f.m->statistics().driver_frees, 2u);
  EXPECT_EQ(f.m->check_invariants(), "");
}

// A page in active use is not returned by the period, however many periods pass.
TEST(Flaws, SlicedDeallocPeriodKeepsActivePages) {
  auto f = make({sliced_pool_config{4096, std::nullopt, std::nullopt, 5}}, 512);
  for (int i = 0; i < 100; ++i) {
    auto h = f.m->reserve(1000).value();
  }
  EXPECT_EQ(f.sim->allocations(), 1u);
  EXPECT_EQ(f.m->statistics().driver_frees, 0u);
}

// Original (cubecl#1384): exclusive cleanup renumbered pages but a held binding kept the old page
// index and panicked or resolved to another allocation. devrt updates every live descriptor, and
// a location that no longer holds the same identity resolves to not_found.
TEST(Flaws, BindingSurvivesRenumberAndStaleCopyIsNotFound) {
  auto f = make({exclusive_pool_config{1024, std::nullopt}}, 32);
  auto a = f.m->reserve(1024).value();
  auto b = f.m->reserve(1024).value();
  auto c = f.m->reserve(1024).value();
  const auto held = b.binding();
  b.reset();
  a.reset();
  c.reset();
  ASSERT_TRUE(f.m->cleanup(true));
  ASSERT_TRUE(f.m->get_storage(held));
  EXPECT_EQ(f.m->usage().bytes_reserved, 1024u);
  // Bind the slice to a new identity: the binding of the old one becomes stale.
  auto d = f.m->reserve(1024).value();
  auto stale = d;
  auto fresh = memory_handle::make();
  ASSERT_TRUE(f.m->bind(std::move(d), fresh));
  EXPECT_EQ(f.m->get_storage(stale).code(), errc::not_found);
  EXPECT_TRUE(f.m->get_storage(fresh));
  EXPECT_EQ(f.m->check_invariants(), "");
}

// Original: bind and find indexed pages and slices without bounds checks and panicked on a
// location from another manager. devrt answers not_found.
TEST(Flaws, ForeignHandleIsNotFoundNotACrash) {
  auto f1 = make({sliced_pool_config{1 << 20, std::nullopt, std::nullopt, std::nullopt}}, 512);
  auto f2 = make({exclusive_pool_config{1 << 20, std::nullopt},
                  sliced_pool_config{1 << 20, std::nullopt, std::nullopt, std::nullopt}},
                 512);
  std::vector<memory_handle> many;
  for (int i = 0; i < 50; ++i) many.push_back(f1.m->reserve(4096).value());
  for (auto& h : many) {
    EXPECT_EQ(f2.m->get_storage(h).code(), errc::not_found);
    EXPECT_EQ(f2.m->bind(h, memory_handle::make()).code(), errc::not_found);
  }
  EXPECT_EQ(f1.m->check_invariants(), "");
  EXPECT_EQ(f2.m->check_invariants(), "");
}

// Original: get_resource's offsets were subtracted without checks and wrapped around.
TEST(Flaws, ResourceViewPastTheEndIsAnError) {
  auto f = make({sliced_pool_config{1 << 20, std::nullopt, std::nullopt, std::nullopt}}, 512);
  auto h = f.m->reserve(100).value();
  EXPECT_EQ(f.m->get_resource(h, 101, std::nullopt).code(), errc::invalid_argument);
  EXPECT_EQ(f.m->get_resource(h, 60, 41).code(), errc::invalid_argument);
  auto ok = f.m->get_resource(h, 60, 40);
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->size, 0u);
}

// Original (cubecl#1612): memory freed inside a capture window was not pinned and was handed to
// later allocations while the graph's replays still wrote to it. devrt pins every slice the window
// touched, including those freed again inside it.
TEST(Flaws, SliceFreedInsideCaptureIsPinnedAndNotHandedOut) {
  auto f = make({sliced_pool_config{1 << 20, std::nullopt, std::nullopt, std::nullopt}}, 512);
  f.m->capture_begin();
  auto scratch = f.m->reserve(4096).value();
  const auto scratch_storage = *f.m->get_storage(scratch);
  scratch.reset();  // an intermediate freed inside the window
  auto out = f.m->reserve(8192).value();
  auto pins = f.m->capture_end().value();
  ASSERT_EQ(pins.size(), 2u);
  // A later persistent request of the same size must not receive the graph's scratch memory.
  f.m->mode(allocation_mode::persistent);
  auto later = f.m->reserve(4096).value();
  const auto later_storage = *f.m->get_storage(later);
  EXPECT_FALSE(later_storage.id == scratch_storage.id);
  EXPECT_EQ(f.m->check_invariants(), "");
}

// Original: configure dropped the old pools without returning their pages when cleanup had not
// emptied them (e.g. during a capture), leaking device memory.
TEST(Flaws, ConfigureNeverLeaksPages) {
  auto f = make({sliced_pool_config{1 << 20, std::nullopt, std::nullopt, std::nullopt}}, 512);
  auto h = f.m->reserve(4096).value();
  f.m->capture_begin();
  h.reset();
  EXPECT_EQ(f.m->configure(memory_layout(preset::exclusive_pages)).code(), errc::capture_active);
  ASSERT_TRUE(f.m->capture_end());
  auto r = f.m->configure(memory_layout(preset::exclusive_pages));
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->applied);
  EXPECT_EQ(f.sim->allocated_bytes(), f.m->statistics().bytes_reserved);
  EXPECT_EQ(f.sim->allocated_bytes(), 0u);
  EXPECT_EQ(f.m->check_invariants(), "");
}
