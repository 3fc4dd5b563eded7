#include <gtest/gtest.h>

#include "devrt/runtime/runtime.hpp"

using namespace devrt;
using namespace devrt::runtime;

TEST(RuntimeSmoke, ReserveThroughFuture) {
  runtime::runtime rt;
  auto c = rt.host();
  auto h = c.reserve(1000).get();
  EXPECT_TRUE(h.can_mut());
  auto u = c.memory_usage().get();
  EXPECT_EQ(u.bytes_in_use, 1000u);
  h.reset();
  EXPECT_EQ(c.memory_usage().get().bytes_in_use, 0u);
}
