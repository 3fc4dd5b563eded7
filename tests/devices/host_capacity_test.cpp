// The host refuses memory it cannot back, when it is asked for, not when the pages are touched:
// address ranges are reserved without memory (MAP_NORESERVE), so nothing in the kernel stops an
// arena from mapping more than the machine holds. Its limit is the memory available (and free
// swap) when the storage is created, at most the machine's memory and swap.
#include <gtest/gtest.h>
#include <sys/sysinfo.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "devrt/devices/host_storage.hpp"
#include "devrt/memory/config.hpp"
#include "devrt/memory/memory_manager.hpp"

namespace {

using devrt::errc;
using devrt::devices::host_options;
using devrt::devices::host_storage;
using devrt::memory::manager_options;
using devrt::memory::memory_manager;
using devrt::memory::storage;

constexpr std::uint64_t MiB = 1024 * 1024;
constexpr std::uint64_t GiB = 1024 * MiB;

std::uint64_t machine_memory() {
  struct sysinfo si {};
  if (::sysinfo(&si) != 0) return 0;
  return (static_cast<std::uint64_t>(si.totalram) + si.totalswap) * (si.mem_unit == 0 ? 1 : si.mem_unit);
}

bool contains(const std::string& s, const std::string& n) { return s.find(n) != std::string::npos; }

// An arena layout whose address space is twice `ask`, in whole GiB.
std::string space_for(std::uint64_t ask) { return "arena:space=" + std::to_string(2 * (ask / GiB + 1)) + "GiB"; }

void expect_refused_at_once(const std::string& layout_text, std::uint64_t ask, std::uint64_t machine) {
  // `machine`: the machine's memory and swap, which bounds each storage's limit.
  SCOPED_TRACE(layout_text);
  auto layout = devrt::memory::parse_layout(layout_text);
  ASSERT_TRUE(layout) << layout.err().message();
  memory_manager m(storage::make<host_storage>(), manager_options{"host", *layout});
  const auto start = std::chrono::steady_clock::now();
  auto r = m.reserve(ask);
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(r) << "a reserve of " << ask << " bytes on a machine with " << machine
                  << " bytes of memory and swap was granted";
  EXPECT_EQ(r.code(), errc::out_of_memory) << r.err().message();
  EXPECT_EQ(r.err().size, ask);
  EXPECT_EQ(r.err().in_use, 0u) << "the arena gives back what this reserve mapped before it failed";
  EXPECT_GT(r.err().limit, 0u);
  EXPECT_LE(r.err().limit, machine);
  EXPECT_LT(r.err().limit, ask);
  const std::string msg = r.err().message();
  EXPECT_TRUE(contains(msg, std::to_string(ask))) << msg;
  EXPECT_TRUE(contains(msg, std::to_string(r.err().limit))) << msg;
  EXPECT_LT(took, std::chrono::seconds(20));
  EXPECT_EQ(m.check_invariants(), "");
  EXPECT_EQ(m.usage().bytes_in_use, 0u);

  // The pool still serves, and the memory it gives is real.
  auto small = m.reserve(3 * MiB);
  ASSERT_TRUE(small) << small.err().message();
  auto res = m.get_resource(*small);
  ASSERT_TRUE(res) << res.err().message();
  std::memset(res->ptr, 0x5a, res->size);
  EXPECT_EQ(static_cast<const unsigned char*>(res->ptr)[res->size - 1], 0x5a);
  EXPECT_EQ(m.check_invariants(), "");
}

TEST(HostCapacity, AnArenaReserveLargerThanTheMachineFailsAtOnce) {
  const std::uint64_t machine = machine_memory();
  ASSERT_GT(machine, 0u);
  const std::uint64_t limit = host_storage().limit();
  EXPECT_GT(limit, 0u);
  EXPECT_LE(limit, machine);
  const std::uint64_t ask = (machine / GiB + 4) * GiB;
  // The default arena's address space is 64 GiB on a host without a capacity.
  if (ask <= 64 * GiB) expect_refused_at_once("auto", ask, machine);
  // An arena space twice the ask, not a fixed 1 TiB: a ThreadSanitizer build's address space has no
  // free run of 1 TiB in about one start in five.
  expect_refused_at_once(space_for(ask), ask, machine);
}

TEST(HostCapacity, AnAddressRangeTheSystemRefusesSaysSoAndLosesNothing) {
  // No process has 2^62 bytes of address space: the range is refused, and the error says it was
  // address space, with the size and the host's memory.
  host_storage s;
  const std::uint64_t machine = s.limit();
  auto r = s.reserve_range(std::uint64_t{1} << 62, 2 * MiB);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.code(), errc::out_of_memory);
  EXPECT_EQ(r.err().size, std::uint64_t{1} << 62);
  EXPECT_EQ(r.err().limit, machine);
  EXPECT_EQ(r.err().in_use, 0u);
  const std::string msg = r.err().message();
  EXPECT_TRUE(contains(msg, "address range")) << msg;
  EXPECT_TRUE(contains(msg, "arena:space=")) << msg;
  EXPECT_TRUE(contains(msg, std::to_string(machine))) << msg;
  // Nothing was kept: a range that fits is still given.
  auto ok = s.reserve_range(64 * MiB, 2 * MiB);
  ASSERT_TRUE(ok) << ok.err().message();
  ASSERT_TRUE(s.map(ok->id, 0, 2 * MiB));
  EXPECT_EQ(s.allocated_bytes(), 2 * MiB);
}

TEST(HostCapacity, MappingsAddUpAgainstTheMachine) {
  // Many requests that each fit, but not together: the sum is checked, not each request.
  const std::uint64_t ask = (machine_memory() / GiB + 4) * GiB;
  auto layout = devrt::memory::parse_layout(space_for(ask));
  ASSERT_TRUE(layout);
  memory_manager m(storage::make<host_storage>(), manager_options{"host", *layout});
  const std::uint64_t machine = m.backing_storage().backend<host_storage>()->limit();
  ASSERT_GT(machine, 0u);
  std::vector<devrt::memory::memory_handle> held;
  std::uint64_t granted = 0;
  for (;;) {
    auto r = m.reserve(GiB);
    if (!r) {
      EXPECT_EQ(r.code(), errc::out_of_memory) << r.err().message();
      EXPECT_EQ(r.err().limit, machine);
      EXPECT_EQ(r.err().in_use, granted);
      break;
    }
    held.push_back(std::move(*r));
    granted += GiB;
    ASSERT_LE(granted, machine) << "more memory granted than the machine has";
  }
  // Every whole GiB the machine has was granted: the refusal came from the sum, not earlier.
  EXPECT_EQ(granted, machine / GiB * GiB);
  EXPECT_EQ(m.check_invariants(), "");
}

TEST(HostCapacity, AnExplicitCapacityIsTheLimit) {
  host_options o;
  o.capacity = 64 * MiB;
  host_storage s(o);
  EXPECT_EQ(s.limit(), 64 * MiB);
  auto range = s.reserve_range(256 * MiB, 2 * MiB);
  ASSERT_TRUE(range) << range.err().message();
  ASSERT_TRUE(s.map(range->id, 0, 64 * MiB));
  auto r = s.map(range->id, 64 * MiB, 2 * MiB);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.code(), errc::out_of_memory);
  EXPECT_EQ(r.err().size, 2 * MiB);
  EXPECT_EQ(r.err().in_use, 64 * MiB);
  EXPECT_EQ(r.err().limit, 64 * MiB);
  s.unmap(range->id, 0, 64 * MiB);
  EXPECT_TRUE(s.map(range->id, 64 * MiB, 2 * MiB));
  EXPECT_EQ(s.allocated_bytes(), 2 * MiB);
}

}  // namespace
