// API edges of the core: reading a failed result throws devrt's exception with the message, and
// a bind that fails leaves the reserved memory with the caller.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <typeinfo>
#include <utility>

#include "devrt/devices/sim_storage.hpp"
#include "devrt/memory/error.hpp"
#include "devrt/memory/memory_manager.hpp"

namespace {

using devrt::errc;
using devrt::error;
using devrt::result;
using devrt::devices::sim_options;
using devrt::devices::sim_storage;
using devrt::memory::manager_options;
using devrt::memory::memory_handle;
using devrt::memory::memory_manager;
using devrt::memory::storage;

error distinctive() {
  error e = error::make(errc::buffer_too_big);
  e.size = 123456789;
  e.limit = 4242;
  return e;
}

/// Runs `f`, expecting devrt::exception with the distinctive error.
template <class F>
void expect_devrt_exception(F&& f) {
  try {
    f();
    ADD_FAILURE() << "no exception";
  } catch (const devrt::exception& e) {
    EXPECT_EQ(e.code(), errc::buffer_too_big);
    EXPECT_NE(std::string(e.what()).find("123456789"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("4242"), std::string::npos) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw " << typeid(e).name() << " instead of devrt::exception: " << e.what();
  }
}

struct point {
  int x = 0;
};

TEST(ResultAccess, DereferencingAnErrorThrowsTheDevrtException) {
  result<int> r = distinctive();
  expect_devrt_exception([&] { (void)*r; });
  const result<int>& cr = r;
  expect_devrt_exception([&] { (void)*cr; });
  expect_devrt_exception([&] { (void)*std::move(r); });
  result<point> p = distinctive();
  expect_devrt_exception([&] { (void)p->x; });
  const result<point>& cp = p;
  expect_devrt_exception([&] { (void)cp->x; });
}

TEST(ResultAccess, DereferencingAValueGivesIt) {
  result<point> p = point{7};
  EXPECT_EQ(p->x, 7);
  EXPECT_EQ((*p).x, 7);
  const result<point>& cp = p;
  EXPECT_EQ(cp->x, 7);
  EXPECT_EQ((*std::move(p)).x, 7);
}

std::unique_ptr<memory_manager> sim_manager() {
  return std::make_unique<memory_manager>(storage::make<sim_storage>(sim_options{}), manager_options{});
}

TEST(BindKeepsTheHandle, AFailedBindLeavesTheMemoryWithTheCaller) {
  auto m = sim_manager();
  memory_handle reserved = m->reserve(4096).value();
  memory_handle taken = m->reserve(1000).value();  // already has memory: binding to it fails
  const auto before = m->usage();

  auto r = m->bind(std::move(reserved), taken);  // NOLINT(bugprone-use-after-move): kept on failure
  ASSERT_FALSE(r);
  EXPECT_EQ(r.code(), errc::already_bound);
  ASSERT_FALSE(reserved.empty()) << "a failed bind consumed the reserved handle";
  auto res = m->get_resource(reserved);
  ASSERT_TRUE(res) << res.err().message();
  EXPECT_EQ(res->size, 4096u);
  EXPECT_EQ(m->usage().number_allocs, before.number_allocs);
  EXPECT_EQ(m->usage().bytes_in_use, before.bytes_in_use);
  EXPECT_EQ(m->check_invariants(), "");

  // The same handle binds once the target is right, and is consumed then.
  memory_handle fresh = memory_handle::make();
  ASSERT_TRUE(m->bind(std::move(reserved), fresh));
  EXPECT_TRUE(reserved.empty());  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(m->get_resource(fresh)->size, 4096u);
  EXPECT_EQ(m->usage().number_allocs, before.number_allocs);
  EXPECT_EQ(m->check_invariants(), "");
}

TEST(BindKeepsTheHandle, AnLvalueIsNeverConsumed) {
  auto m = sim_manager();
  memory_handle reserved = m->reserve(4096).value();
  ASSERT_FALSE(m->bind(reserved, memory_handle{}));  // empty target: invalid_argument
  EXPECT_EQ(reserved.use_count(), 1u);
  EXPECT_TRUE(m->get_resource(reserved));
  memory_handle fresh = memory_handle::make();
  ASSERT_TRUE(m->bind(reserved, fresh));
  // Bound: the caller's copy is stale like every copy of a bound handle, the memory is fresh's.
  EXPECT_EQ(m->get_resource(reserved).code(), errc::not_found);
  EXPECT_EQ(m->get_resource(fresh)->size, 4096u);
  EXPECT_EQ(m->usage().number_allocs, 1u);
  EXPECT_EQ(m->check_invariants(), "");
}

}  // namespace
