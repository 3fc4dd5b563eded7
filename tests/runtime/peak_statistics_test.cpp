// compute_client::reset_peak_statistics: the peaks drop to the current values and then follow new
// highs; the counters are kept.
#include <gtest/gtest.h>

#include "devrt/runtime/runtime.hpp"

namespace rt = devrt::runtime;

TEST(PeakStatistics, ResetSetsThePeaksToTheCurrentValuesAndKeepsTheCounters) {
  rt::runtime_options opts;
  opts.use_cuda = false;
  opts.use_environment = false;
  rt::runtime runtime(opts);
  const rt::compute_client host = runtime.host();

  auto big = host.reserve(4 << 20).get();
  auto small = host.reserve(1000).get();
  big.reset();
  const auto before = host.statistics().get();
  ASSERT_EQ(before.bytes_in_use, 1000U);
  ASSERT_EQ(before.peak_bytes_in_use, (4U << 20) + 1000U);

  host.reset_peak_statistics().get();
  const auto after = host.statistics().get();
  EXPECT_EQ(after.peak_bytes_in_use, after.bytes_in_use);
  EXPECT_EQ(after.peak_bytes_reserved, after.bytes_reserved);
  EXPECT_EQ(after.reserves, before.reserves);
  EXPECT_EQ(after.driver_allocs, before.driver_allocs);

  auto more = host.reserve(3000).get();
  const auto later = host.statistics().get();
  EXPECT_EQ(later.peak_bytes_in_use, 4000U);
  EXPECT_GE(later.peak_bytes_reserved, later.bytes_reserved);
}
