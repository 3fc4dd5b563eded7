// Statistics that tell the truth: memory the pools gave back stays counted until the device has
// it back (queued frees, unmaps behind queued work), so reserved + returning is always what the
// device holds for devrt.
#include <gtest/gtest.h>

#include "devrt/devices/sim_storage.hpp"
#include "devrt/memory/memory_manager.hpp"

using namespace devrt;
using namespace devrt::memory;

TEST(StatisticsTruth, AQueuedFreeStaysCountedUntilTheFlush) {
  auto store = storage::make<devices::sim_storage>(devices::sim_options{});
  auto* sim = store.backend<devices::sim_storage>();
  manager_options opts;
  opts.layout = parse_layout("sliced:page=4MiB,slice=1MiB,period=2").value();
  memory_manager m(std::move(store), opts);
  (void)m.reserve(1 << 20).value();                                 // dropped at once: its page goes idle
  for (int i = 0; i < 4; ++i) (void)m.reserve(64ULL << 20).code();  // ticks; no pool takes 64 MiB
  const auto& s = m.statistics();
  ASSERT_EQ(s.driver_frees, 1u) << "the idle page was not released by its period";
  EXPECT_EQ(s.bytes_reserved, 0u);
  EXPECT_EQ(s.bytes_returning, 4u << 20) << "the queued free is not counted while the device still holds it";
  EXPECT_EQ(sim->allocated_bytes(), s.bytes_reserved + s.bytes_returning);
  EXPECT_EQ(s.peak_bytes_reserved, 4u << 20);
  ASSERT_TRUE(m.flush());
  EXPECT_EQ(m.statistics().bytes_returning, 0u);
  EXPECT_EQ(sim->allocated_bytes(), 0u);
}

TEST(StatisticsTruth, ReservedAndReturningAlwaysAddUpToTheDevice) {
  auto store = storage::make<devices::sim_storage>(devices::sim_options{});
  auto* sim = store.backend<devices::sim_storage>();
  manager_options opts;
  opts.layout = parse_layout("sliced:page=8MiB,slice=2MiB,period=3;exclusive:max=64MiB,period=3").value();
  memory_manager m(std::move(store), opts);
  std::vector<memory_handle> live;
  for (int i = 0; i < 400; ++i) {
    const std::uint64_t size = (i * 7919ULL % 40 + 1) << 19;
    if (auto r = m.reserve(size)) live.push_back(std::move(*r));
    if (i % 3 == 0 && !live.empty()) live.erase(live.begin() + static_cast<std::ptrdiff_t>(i % live.size()));
    if (i % 17 == 0) {
      ASSERT_TRUE(m.flush());
    }
    const auto& s = m.statistics();
    ASSERT_EQ(sim->allocated_bytes(), s.bytes_reserved + s.bytes_returning) << "step " << i;
    ASSERT_GE(s.peak_bytes_reserved, sim->allocated_bytes()) << "step " << i;
  }
  EXPECT_EQ(m.check_invariants(), "");
}
