#include <gtest/gtest.h>

#include "devrt/devices/host_storage.hpp"
#include "devrt/memory/memory_manager.hpp"

using namespace devrt;
using namespace devrt::memory;

TEST(Smoke, ReserveBindRelease) {
  memory_manager m(storage::make<devices::host_storage>(), {});
  auto h = m.reserve(1000);
  ASSERT_TRUE(h) << h.err().message();
  EXPECT_TRUE(h->can_mut());
  auto r = m.get_resource(*h);
  ASSERT_TRUE(r);
  EXPECT_NE(r->ptr, nullptr);
  EXPECT_EQ(m.usage().bytes_in_use, 1000u);
  EXPECT_EQ(m.check_invariants(), "");
  h->reset();
  EXPECT_EQ(m.usage().bytes_in_use, 0u);
  EXPECT_EQ(m.check_invariants(), "");
}
