// Bad input to the simulated device's address ranges: a range far larger than this machine could
// keep bookkeeping for must be refused like a device that cannot reserve the addresses, and an arena
// over it must report the refusal to the caller rather than throw out of reserve.

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "devrt/devices/sim_storage.hpp"
#include "devrt/memory/memory_manager.hpp"

namespace {

using devrt::errc;
using devrt::devices::sim_options;
using devrt::devices::sim_storage;

// sim_storage::reserve_range keeps a byte and a word per granule of the range, so a range of 2^36
// granules (the arena layout "arena:space=0184467440709551615" on an H200) asks for hundreds of
// gigabytes: std::bad_alloc out of memory_manager::reserve, an abort under ASan.
TEST(SimStorageBadInput, AHugeAddressRangeIsRefusedNotAllocated) {
  sim_storage s(sim_options::h200());
  const std::uint64_t unit = s.properties().map_granularity;
  ASSERT_GT(unit, 0u);
  auto r = s.reserve_range(std::uint64_t{1} << 57, unit);
  ASSERT_FALSE(r) << "2^57 bytes of addresses were reserved";
  EXPECT_EQ(r.code(), errc::out_of_memory) << r.err().message();

  namespace mem = devrt::memory;
  mem::manager_options o;
  // An arena whose address space (2^60 bytes, allowed in a layout) the device cannot reserve.
  o.layout = mem::parse_layout("arena:space=1048576TiB").value();
  mem::memory_manager m(mem::storage::make<sim_storage>(sim_options::h200()), o);
  auto h = m.reserve(4096);
  ASSERT_FALSE(h);
  EXPECT_TRUE(devrt::is_transient(h.code()) || h.code() == errc::device_error) << h.err().message();
  EXPECT_EQ(m.check_invariants(), "");
}

}  // namespace
