#include "devrt/devices/sim_storage.hpp"

#include <gtest/gtest.h>

using namespace devrt;
using devrt::devices::sim_options;
using devrt::devices::sim_storage;

TEST(SimStorage, H200Properties) {
  const auto o = sim_options::h200();
  EXPECT_EQ(o.props.alignment, 512u);
  EXPECT_EQ(o.props.capacity, 150'109'880'320ULL);
  EXPECT_EQ(o.props.max_page_size, 150'109'880'320ULL / 4);
}
