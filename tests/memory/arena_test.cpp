// The arena pool (memory/arena_pool.hpp) through the memory manager: one reserved address range,
// best fit with coalescing, memory mapped only behind live slices, free mappings kept until memory
// is needed elsewhere (or the slack says otherwise), and the arena layouts and their validation.
//
// The device is a simulated one with 2 MiB map granules, so every figure below is exact: the
// statistics of the manager are compared with the bytes the simulated device has mapped.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "devrt/devices/host_storage.hpp"
#include "devrt/devices/sim_storage.hpp"
#include "devrt/memory/memory_manager.hpp"

namespace {

using namespace devrt;
using namespace devrt::memory;
using devrt::devices::host_options;
using devrt::devices::host_storage;
using devrt::devices::sim_options;
using devrt::devices::sim_storage;

constexpr std::uint64_t KiB = 1024;
constexpr std::uint64_t MiB = 1024 * KiB;
constexpr std::uint64_t GiB = 1024 * MiB;
constexpr std::uint64_t kGranule = 2 * MiB;
constexpr std::uint64_t kAlign = 512;

device_properties mapping_props(std::uint64_t capacity = 0) {
  return device_properties{GiB, kAlign, capacity, kGranule};
}
device_properties plain_props(std::uint64_t capacity = 0) { return device_properties{GiB, kAlign, capacity, 0}; }

sim_options mapping_sim(std::uint64_t capacity = 0) {
  sim_options o;
  o.props = mapping_props(capacity);
  o.name = "sim-map";
  return o;
}

memory_layout layout_of(std::string_view text) {
  auto l = parse_layout(text);
  EXPECT_TRUE(l) << text << ": " << (l ? "" : l.err().message());
  return l ? *l : memory_layout{};
}

manager_options options_of(memory_layout layout) {
  manager_options o;
  o.name = "arena-test";
  o.layout = std::move(layout);
  return o;
}

// A manager over a mapping sim device, and the device itself for inspection.
struct arena_env {
  std::unique_ptr<memory_manager> m;
  sim_storage* sim = nullptr;

  explicit arena_env(std::string_view layout, std::uint64_t capacity = 0) {
    m = std::make_unique<memory_manager>(storage::make<sim_storage>(mapping_sim(capacity)),
                                         options_of(layout_of(layout)));
    sim = m->backing_storage().backend<sim_storage>();
  }

  memory_handle reserve(std::uint64_t size) {
    auto r = m->reserve(size);
    EXPECT_TRUE(r) << "reserve(" << size << "): " << (r ? "" : r.err().message());
    return r ? std::move(*r) : memory_handle{};
  }
  std::uint64_t offset(const memory_handle& h) {
    auto s = m->get_storage(h);
    EXPECT_TRUE(s) << (s ? "" : s.err().message());
    return s ? s->offset : ~std::uint64_t{0};
  }
  memory_statistics stats() { return m->statistics(); }
  std::uint64_t reserved() { return m->statistics().bytes_reserved; }
  // The manager's count of mapped bytes agrees with the device's, and the pools are consistent.
  void check() {
    EXPECT_EQ(m->check_invariants(), "");
    EXPECT_EQ(sim->mapped_bytes(), reserved()) << "the manager and the device disagree on the mapped bytes";
    EXPECT_EQ(sim->misuses(), 0u) << "the arena broke the mapping contract";
  }
};

// ---- Mapping behind slices ----

TEST(ArenaPool, ReserveMapsOnlyTheGranulesUnderTheSlice) {
  arena_env env("arena:space=256MiB");
  ASSERT_EQ(env.m->layout().size(), 1u);
  EXPECT_EQ(env.m->layout()[0].kind, pool_kind::arena);
  EXPECT_EQ(env.sim->range_count(), 0u) << "the address range is reserved on first use";

  auto a = env.reserve(1 * MiB);
  EXPECT_EQ(env.offset(a), 0u);
  EXPECT_EQ(env.sim->range_count(), 1u);
  EXPECT_EQ(env.stats().maps, 1u);
  EXPECT_EQ(env.reserved(), kGranule) << "a 1 MiB slice maps its one granule, not the 256 MiB range";
  EXPECT_EQ(env.m->usage().bytes_reserved, kGranule);
  env.check();

  // Slices in the same granule share its mapping.
  auto b = env.reserve(512 * KiB);
  auto c = env.reserve(512 * KiB);
  EXPECT_EQ(env.offset(b), 1 * MiB);
  EXPECT_EQ(env.offset(c), 1 * MiB + 512 * KiB);
  EXPECT_EQ(env.stats().maps, 1u);
  EXPECT_EQ(env.reserved(), kGranule);
  env.check();

  // The next byte starts the next granule.
  auto d = env.reserve(1);
  EXPECT_EQ(env.offset(d), kGranule);
  EXPECT_EQ(env.stats().maps, 2u);
  EXPECT_EQ(env.reserved(), 2 * kGranule);
  const memory_usage u = env.m->usage();
  EXPECT_EQ(u.number_allocs, 4u);
  EXPECT_EQ(u.bytes_in_use, 2 * MiB + 1);
  EXPECT_EQ(u.bytes_padding, kAlign - 1);
  env.check();
}

TEST(ArenaPool, WholeGranulesAreMappedOneChunkAtATimeAndAPartialLastGranuleApart) {
  arena_env env("arena:space=256MiB");
  // 65 MiB from offset 0: granules 0..31 whole (two 32 MiB chunks), granule 32 half used.
  auto big = env.reserve(65 * MiB);
  EXPECT_EQ(env.offset(big), 0u);
  EXPECT_EQ(env.stats().maps, 3u) << "one mapping per 32 MiB chunk and one of the last granule";
  EXPECT_EQ(env.reserved(), 66 * MiB);
  EXPECT_EQ(env.sim->mapped_bytes(), 66 * MiB);
  env.check();

  // The rest of the last granule is shared by the next slice, which maps nothing.
  auto tail = env.reserve(1 * MiB);
  EXPECT_EQ(env.offset(tail), 65 * MiB);
  EXPECT_EQ(env.stats().maps, 3u);
  EXPECT_EQ(env.reserved(), 66 * MiB);
  env.check();

  // Mappings end at chunk multiples of the range: 64 MiB from 66 MiB covers granules 33..64,
  // cut at granules 48 and 64 into three mappings (15, 16 and 1 granules).
  auto exact = env.reserve(64 * MiB);
  EXPECT_EQ(env.offset(exact), 66 * MiB);
  EXPECT_EQ(env.stats().maps, 6u);
  EXPECT_EQ(env.reserved(), 130 * MiB);
  env.check();

  // The big slice's chunks are mappings of their own: once it is gone they are unmapped, while
  // the mapping of its last granule stays for the slice that still uses it.
  big.reset();
  EXPECT_EQ(env.reserved(), 130 * MiB) << "free memory stays mapped until a cleanup or a need elsewhere";
  ASSERT_TRUE(env.m->cleanup(true));
  EXPECT_EQ(env.stats().unmaps, 2u);
  EXPECT_EQ(env.reserved(), 66 * MiB);
  EXPECT_EQ(env.sim->mapped_bytes(), 66 * MiB);
  env.check();
}

TEST(ArenaPool, DroppedMemoryStaysMappedAndIsReusedWithoutMapping) {
  arena_env env("arena:space=256MiB");
  auto a = env.reserve(64 * MiB);
  auto guard = env.reserve(1 * MiB);
  EXPECT_EQ(env.offset(a), 0u);
  EXPECT_EQ(env.offset(guard), 64 * MiB);
  EXPECT_EQ(env.stats().maps, 3u);
  EXPECT_EQ(env.reserved(), 66 * MiB);

  a.reset();
  EXPECT_EQ(env.reserved(), 66 * MiB);
  EXPECT_EQ(env.stats().unmaps, 0u);
  EXPECT_EQ(env.m->usage().bytes_in_use, 1 * MiB);
  env.check();

  // Same size, same hole (the best fit): no driver call.
  auto b = env.reserve(64 * MiB);
  EXPECT_EQ(env.offset(b), 0u);
  EXPECT_EQ(env.stats().maps, 3u);
  EXPECT_EQ(env.reserved(), 66 * MiB);
  env.check();

  // A smaller slice in the warm hole maps nothing either.
  b.reset();
  auto c = env.reserve(10 * MiB);
  EXPECT_EQ(env.offset(c), 0u);
  EXPECT_EQ(env.stats().maps, 3u);
  EXPECT_EQ(env.stats().unmaps, 0u);
  EXPECT_EQ(env.reserved(), 66 * MiB);
  env.check();
}

TEST(ArenaPool, MappingElsewhereUnmapsFreeMemoryFirst) {
  arena_env env("arena:space=256MiB");
  auto a = env.reserve(32 * MiB);  // granules 0..15: one mapping
  auto b = env.reserve(32 * MiB);  // granules 16..31: one mapping
  EXPECT_EQ(env.offset(b), 32 * MiB);
  EXPECT_EQ(env.stats().maps, 2u);
  EXPECT_EQ(env.reserved(), 64 * MiB);

  a.reset();
  EXPECT_EQ(env.reserved(), 64 * MiB);
  // 48 MiB does not fit in A's 32 MiB hole: it lands after B, on 24 granules without memory.
  // A's free mapping (16 granules) is unmapped first, so the memory held is what B and C use.
  auto c = env.reserve(48 * MiB);
  EXPECT_EQ(env.offset(c), 64 * MiB);
  const memory_statistics s = env.stats();
  EXPECT_EQ(s.unmaps, 1u);
  EXPECT_EQ(s.maps, 4u) << "granules 32..47 and 48..55";
  EXPECT_EQ(s.bytes_reserved, 80 * MiB);
  EXPECT_EQ(s.peak_bytes_reserved, 80 * MiB) << "without the unmap the peak would be 112 MiB";
  env.check();

  // Explicit cleanup gives back every free mapping: what is left is what the live slices need.
  b.reset();
  EXPECT_EQ(env.reserved(), 80 * MiB);
  ASSERT_TRUE(env.m->cleanup(true));
  EXPECT_EQ(env.stats().cleanups, 1u);
  EXPECT_EQ(env.reserved(), 48 * MiB);
  EXPECT_EQ(env.sim->mapped_bytes(), 48 * MiB);
  env.check();

  c.reset();
  ASSERT_TRUE(env.m->cleanup(true));
  EXPECT_EQ(env.reserved(), 0u);
  EXPECT_EQ(env.sim->mapped_bytes(), 0u);
  EXPECT_EQ(env.sim->range_count(), 1u) << "the addresses stay reserved while the pool lives";
  EXPECT_EQ(env.m->usage(), memory_usage{});
  env.check();
}

TEST(ArenaPool, TheOldestFreeMappingIsUnmappedFirst) {
  arena_env env("arena:space=256MiB");
  auto a = env.reserve(8 * MiB);   // granules 0..3
  auto g1 = env.reserve(2 * MiB);  // granule 4
  auto b = env.reserve(8 * MiB);   // granules 5..8
  auto g2 = env.reserve(2 * MiB);  // granule 9
  auto d = env.reserve(8 * MiB);   // granules 10..13
  EXPECT_EQ(env.offset(b), 10 * MiB);
  EXPECT_EQ(env.offset(d), 20 * MiB);
  EXPECT_EQ(env.reserved(), 28 * MiB);
  const storage_id range = env.m->get_storage(a)->id;

  // Freed in this order: A's mapping is the oldest free one, then B's, then D's.
  a.reset();
  (void)env.stats();
  b.reset();
  (void)env.stats();
  d.reset();
  env.check();

  // 12 MiB fits in no 8 MiB hole: it lands on D's free mapping and needs granules 14 and 15.
  auto r = env.reserve(12 * MiB);
  EXPECT_EQ(env.offset(r), 20 * MiB);
  EXPECT_EQ(env.stats().unmaps, 1u);
  EXPECT_EQ(env.reserved(), 24 * MiB) << "28 MiB - A's 8 MiB + 4 MiB for granules 14..15";
  env.check();
  // A's granules lost their memory; B's kept it.
  EXPECT_EQ(env.sim->get(storage_handle{range, 0, 1}).code(), errc::invalid_argument);
  EXPECT_TRUE(env.sim->get(storage_handle{range, 10 * MiB, 8 * MiB}));

  ASSERT_TRUE(env.m->cleanup(true));
  EXPECT_EQ(env.stats().unmaps, 2u) << "B's mapping was the only free one left";
  EXPECT_EQ(env.reserved(), 16 * MiB);
  env.check();
}

// ---- Slack ----

TEST(ArenaPool, ZeroSlackUnmapsAsSoonAsFreed) {
  arena_env env("arena:space=256MiB,slack=0");
  auto a = env.reserve(10 * MiB);
  EXPECT_EQ(env.reserved(), 10 * MiB);
  a.reset();
  EXPECT_EQ(env.reserved(), 0u);
  EXPECT_EQ(env.stats().unmaps, 1u);
  EXPECT_EQ(env.sim->mapped_bytes(), 0u);
  env.check();

  // A shared granule is unmapped when its last slice goes.
  auto x = env.reserve(1 * MiB);
  auto y = env.reserve(1 * MiB);
  EXPECT_EQ(env.reserved(), kGranule);
  x.reset();
  EXPECT_EQ(env.reserved(), kGranule);
  env.check();
  y.reset();
  EXPECT_EQ(env.reserved(), 0u);
  env.check();
}

TEST(ArenaPool, SlackBoundsTheFreeMemoryKeptMapped) {
  for (const std::uint64_t slack : {8 * MiB, 5 * MiB, 4 * MiB, 3 * MiB}) {
    SCOPED_TRACE(testing::Message() << "slack " << slack);
    arena_env env("arena:space=256MiB,slack=" + std::to_string(slack));
    // Four slices of two granules, each mapped by a reserve of its own: four 4 MiB mappings.
    std::vector<memory_handle> hs;
    for (int i = 0; i < 4; ++i) hs.push_back(env.reserve(4 * MiB));
    EXPECT_EQ(env.stats().maps, 4u);
    EXPECT_EQ(env.reserved(), 16 * MiB);
    std::uint64_t live = 4;
    while (!hs.empty()) {
      hs.pop_back();
      --live;
      const std::uint64_t held = env.reserved();
      EXPECT_GE(held, live * 4 * MiB);
      EXPECT_LE(held - live * 4 * MiB, slack) << "free mappings beyond the slack must be unmapped";
      env.check();
    }
    // Whole mappings are kept: as many as fit in the slack.
    EXPECT_EQ(env.reserved(), std::min<std::uint64_t>(slack / (4 * MiB), 4) * 4 * MiB);
    ASSERT_TRUE(env.m->cleanup(true));
    EXPECT_EQ(env.reserved(), 0u) << "an explicit cleanup unmaps the slack too";
    env.check();
  }
}

// ---- Growth: larger mappings where the arena grows, free memory kept within a budget ----

TEST(ArenaPool, GrowthMapsAheadAtTheFreeEndWithinTheBudget) {
  arena_env env("arena:space=64GiB");
  std::vector<memory_handle> live;
  std::uint64_t in_use = 0;
  for (int i = 0; i < 512; ++i) {
    live.push_back(env.reserve(8 * MiB));
    in_use += 8 * MiB;
    // Mapped ahead at most to 1.01 times the live bytes (to the granule below).
    ASSERT_LE(env.reserved(), in_use + in_use / 100 + kGranule) << "slice " << i;
  }
  env.check();
  // One mapping per slice without the policy (each is four whole granules at the growing end).
  EXPECT_LT(env.stats().maps, 512u / 2) << "mappings ahead serve the next slices";
  EXPECT_EQ(env.stats().unmaps, 0u);
}

TEST(ArenaPool, GrowthKeepsFreeMemoryMappedWithinTheBudget) {
  for (const char* layout : {"arena:space=1GiB", "arena:space=1GiB,grow=0"}) {
    SCOPED_TRACE(layout);
    arena_env env(layout);
    auto a = env.reserve(40 * MiB);
    auto g = env.reserve(2 * MiB);
    auto b = env.reserve(40 * MiB);
    auto x = env.reserve(40 * MiB);
    EXPECT_EQ(env.reserved(), 122 * MiB);
    a.reset();
    x.reset();
    // 44 MiB does not fit A's hole: it goes where X was, and needs 4 MiB more. 126 MiB mapped is
    // within 1.04 times the 122 MiB live at the peak, so A's free memory stays mapped with the
    // policy; without it, as much free memory is unmapped first.
    auto d = env.reserve(44 * MiB);
    EXPECT_EQ(env.offset(d), 82 * MiB);
    if (std::string_view(layout).find("grow=0") == std::string_view::npos) {
      EXPECT_EQ(env.stats().unmaps, 0u);
      EXPECT_EQ(env.reserved(), 126 * MiB);
      // Past the budget (1.04 times 134 MiB live), free mappings are unmapped, the largest first,
      // until the new one fits: A's 32 MiB chunk is not enough, its 8 MiB rest goes too.
      auto e = env.reserve(48 * MiB);
      EXPECT_EQ(env.stats().unmaps, 2u);
      EXPECT_LE(env.reserved(), (2 + 40 + 44 + 48) * MiB * 104 / 100);
    } else {
      EXPECT_GE(env.stats().unmaps, 1u);
      EXPECT_LE(env.reserved(), 122 * MiB);
    }
    env.check();
  }
}

// ---- Placement ----

TEST(ArenaPool, FreeNeighboursMergeAndBestFitFindsThem) {
  arena_env env("arena:space=256MiB");
  auto left = env.reserve(4 * MiB);
  auto middle = env.reserve(4 * MiB);
  auto right = env.reserve(4 * MiB);
  auto guard = env.reserve(4 * MiB);
  EXPECT_EQ(env.offset(left), 0u);
  EXPECT_EQ(env.offset(middle), 4 * MiB);
  EXPECT_EQ(env.offset(right), 8 * MiB);
  EXPECT_EQ(env.offset(guard), 12 * MiB);

  middle.reset();
  env.check();
  left.reset();
  env.check();
  // Only the merged 8 MiB hole holds 8 MiB below the guard: the reserve lands at left's offset,
  // in memory that is still mapped.
  const std::uint64_t maps = env.stats().maps;
  auto merged = env.reserve(8 * MiB);
  EXPECT_EQ(env.offset(merged), 0u);
  EXPECT_EQ(env.stats().maps, maps);
  env.check();

  // A hole merges with the one after it too; the smallest hole that fits wins over a larger one.
  merged.reset();
  right.reset();  // [0, 12 MiB) free, guard at 12 MiB, then the rest of the range
  env.check();
  auto fit = env.reserve(12 * MiB);
  EXPECT_EQ(env.offset(fit), 0u);
  auto next = env.reserve(1 * MiB);
  EXPECT_EQ(env.offset(next), 16 * MiB);
  env.check();

  // Equal holes: the lower offset wins.
  fit.reset();
  next.reset();
  auto p = env.reserve(4 * MiB);
  auto q = env.reserve(4 * MiB);
  auto sep = env.reserve(4 * MiB);
  EXPECT_EQ(env.offset(p), 0u);
  EXPECT_EQ(env.offset(q), 4 * MiB);
  EXPECT_EQ(env.offset(sep), 8 * MiB);
  q.reset();
  p.reset();  // one 8 MiB hole at 0 (merged)
  auto one = env.reserve(3 * MiB);
  EXPECT_EQ(env.offset(one), 0u);
  env.check();
}

TEST(ArenaPool, TheFreeEndBelowTheHighWaterMarkIsAHoleForSlicesLargerThanAGranule) {
  arena_env env("arena:space=512MiB");
  auto input = env.reserve(96 * MiB);
  auto keep = env.reserve(4 * MiB);
  auto scratch = env.reserve(40 * MiB);
  EXPECT_EQ(env.offset(input), 0u);
  EXPECT_EQ(env.offset(keep), 96 * MiB);
  EXPECT_EQ(env.offset(scratch), 100 * MiB);
  scratch.reset();  // the free end starts at 100 MiB; 40 MiB of it lie below the highest address used
  input.reset();    // a 96 MiB hole at 0
  env.check();

  // 24 MiB fits the 40 MiB below the high-water mark tighter than the 96 MiB hole: it goes there,
  // and the next 96 MiB slice finds its hole whole instead of raising the high-water mark.
  auto output = env.reserve(24 * MiB);
  EXPECT_EQ(env.offset(output), 100 * MiB);
  auto next_input = env.reserve(96 * MiB);
  EXPECT_EQ(env.offset(next_input), 0u);
  env.check();

  // A slice of a granule or less keeps to the holes: the 96 MiB hole, not the 16 MiB still free
  // below the high-water mark.
  next_input.reset();
  auto small = env.reserve(1 * MiB);
  EXPECT_EQ(env.offset(small), 0u);
  small.reset();
  env.check();

  // An explicit cleanup forgets the high-water mark above the live slices: memory given back on
  // request is not a hole, and the best fit takes the hole at 0 again.
  output.reset();
  ASSERT_TRUE(env.m->cleanup(true));
  auto after = env.reserve(24 * MiB);
  EXPECT_EQ(env.offset(after), 0u);
  env.check();
}

TEST(ArenaPool, TheFreeEndBelowTheHighWaterMarkWinsOnlyWhereItMapsNoMoreThanTheHole) {
  // Mappings of one granule, no growth policy, and a slack of 96 MiB: free mappings beyond it are
  // unmapped as soon as they are freed.
  arena_env env("arena:space=512MiB,chunk=2MiB,grow=0,slack=96MiB");
  auto input = env.reserve(96 * MiB);
  auto keep = env.reserve(4 * MiB);
  auto scratch = env.reserve(40 * MiB);
  EXPECT_EQ(env.offset(scratch), 100 * MiB);
  input.reset();    // a 96 MiB hole, mapped
  scratch.reset();  // 40 MiB free below the high-water mark, beyond the slack: unmapped
  ASSERT_EQ(env.reserved(), 100 * MiB) << "the 96 MiB hole and the live 4 MiB stay mapped";
  env.check();
  // 24 MiB fits the free end's 40 MiB tighter, but would map 12 granules there and none in the hole.
  const std::uint64_t maps = env.stats().maps;
  auto output = env.reserve(24 * MiB);
  EXPECT_EQ(env.offset(output), 0u);
  EXPECT_EQ(env.stats().maps, maps);
  env.check();
}

TEST(ArenaPool, ZeroAndOneByteSlicesHaveDistinctAddresses) {
  arena_env env("arena:space=256MiB");
  auto z0 = env.reserve(0);
  auto o1 = env.reserve(1);
  auto z1 = env.reserve(0);
  EXPECT_EQ(env.offset(z0), 0u);
  EXPECT_EQ(env.offset(o1), kAlign);
  EXPECT_EQ(env.offset(z1), 2 * kAlign);
  auto r0 = env.m->get_resource(z0);
  auto r1 = env.m->get_resource(o1);
  ASSERT_TRUE(r0) << r0.err().message();
  ASSERT_TRUE(r1) << r1.err().message();
  EXPECT_EQ(r0->size, 0u);
  EXPECT_EQ(r1->size, 1u);
  EXPECT_NE(r0->handle.offset, r1->handle.offset);
  EXPECT_EQ(env.stats().maps, 1u);
  const memory_usage u = env.m->usage();
  EXPECT_EQ(u.number_allocs, 3u);
  EXPECT_EQ(u.bytes_in_use, 1u);
  EXPECT_EQ(u.bytes_padding, 3 * kAlign - 1);
  env.check();
}

TEST(ArenaPool, BindLookupsAndStaleHandles) {
  arena_env env("arena:space=256MiB");
  auto first = env.reserve(3 * MiB);
  memory_handle reserved = env.reserve(4096);
  const memory_handle stale = reserved;
  const std::uint64_t at = env.offset(reserved);
  EXPECT_EQ(at, 3 * MiB);

  memory_handle assigned = memory_handle::make();
  ASSERT_TRUE(env.m->bind(std::move(reserved), assigned, 42));
  auto cursor = env.m->get_cursor(assigned);
  ASSERT_TRUE(cursor);
  EXPECT_EQ(*cursor, 42u);
  auto st = env.m->get_storage(assigned);
  ASSERT_TRUE(st);
  EXPECT_EQ(st->offset, at);
  EXPECT_EQ(st->size, 4096u);
  auto res = env.m->get_resource(assigned, 96, 1000);
  ASSERT_TRUE(res) << res.err().message();
  EXPECT_EQ(res->size, 4096u - 96 - 1000);
  EXPECT_EQ(res->handle.offset, at + 96);
  EXPECT_EQ(env.m->get_resource(assigned, 4097).code(), errc::invalid_argument);

  EXPECT_EQ(env.m->get_storage(stale).code(), errc::not_found);
  EXPECT_EQ(env.m->get_resource(stale).code(), errc::not_found);
  EXPECT_EQ(env.m->get_cursor(stale).code(), errc::not_found);
  EXPECT_EQ(env.m->bind(stale, memory_handle::make()).code(), errc::not_found);
  env.check();

  // A binding keeps the slice alive after the last handle is gone.
  memory_binding b = assigned.binding();
  memory_handle copy = assigned;
  assigned.reset();
  copy.reset();
  EXPECT_EQ(env.m->usage().number_allocs, 2u);
  auto via_binding = env.m->get_storage(b);
  ASSERT_TRUE(via_binding);
  EXPECT_EQ(via_binding->offset, at);
  b = memory_binding{};
  EXPECT_EQ(env.m->usage().number_allocs, 1u);
  EXPECT_EQ(env.m->usage().bytes_in_use, 3 * MiB);
  env.check();
}

TEST(ArenaPool, HostMemoryBehindTheArenaIsUsable) {
  host_options ho;
  ho.alignment = 64;
  ho.max_page_size = GiB;
  ho.map_granularity = kGranule;
  memory_manager m(storage::make<host_storage>(ho), options_of(layout_of("arena:space=64MiB")));
  ASSERT_EQ(m.layout().front().kind, pool_kind::arena);
  auto z = m.reserve(0);
  auto one = m.reserve(1);
  auto big = m.reserve(3 * MiB);
  ASSERT_TRUE(z && one && big);
  auto rz = m.get_resource(*z);
  auto r1 = m.get_resource(*one);
  auto rb = m.get_resource(*big);
  ASSERT_TRUE(rz && r1 && rb);
  ASSERT_NE(r1->ptr, nullptr);
  ASSERT_NE(rb->ptr, nullptr);
  EXPECT_NE(rz->ptr, r1->ptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(rb->ptr) % 64, 0u);
  // The 3 MiB slice crosses a granule boundary: every byte of it is mapped and writable.
  std::memset(rb->ptr, 0x5A, 3 * MiB);
  *static_cast<unsigned char*>(r1->ptr) = 0x11;
  std::vector<unsigned char> back(3 * MiB);
  ASSERT_TRUE(m.backing_storage().read(rb->handle, back.data()));
  EXPECT_TRUE(std::all_of(back.begin(), back.end(), [](unsigned char c) { return c == 0x5A; }));
  EXPECT_EQ(*static_cast<unsigned char*>(r1->ptr), 0x11);
  EXPECT_EQ(m.statistics().bytes_reserved, 4 * MiB);
  EXPECT_EQ(m.backing_storage().backend<host_storage>()->allocated_bytes(), 4 * MiB);
  EXPECT_EQ(m.check_invariants(), "");
  z->reset();
  one->reset();
  big->reset();
  ASSERT_TRUE(m.cleanup(true));
  EXPECT_EQ(m.statistics().bytes_reserved, 0u);
  EXPECT_EQ(m.backing_storage().backend<host_storage>()->allocated_bytes(), 0u);
  EXPECT_EQ(m.check_invariants(), "");
}

// ---- Failures ----

TEST(ArenaPool, AFailedMapLeavesThePoolAsItWas) {
  // Without the growth policy (grow=0), whose mappings are counted below: with it, the run of
  // granules 48..50 would keep its last granule and make one mapping fewer.
  arena_env env("arena:space=256MiB,grow=0");
  auto a = env.reserve(32 * MiB);
  EXPECT_EQ(env.reserved(), 32 * MiB);
  const memory_statistics before = env.stats();

  // 69 MiB from 32 MiB ends inside granule 50: four mappings (granules 16..31, 32..47, 48..49,
  // and 50 on its own); the second one fails, and the first is given back.
  env.sim->fail_allocation(2);
  auto r = env.m->reserve(69 * MiB);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.code(), errc::out_of_memory);
  EXPECT_EQ(r.err().size, 69 * MiB);
  // What the device holds after the rollback, not at the refusal.
  EXPECT_EQ(r.err().in_use, 32 * MiB);
  EXPECT_EQ(r.err().in_use, env.sim->allocated_bytes());
  const memory_statistics s = env.stats();
  EXPECT_EQ(s.bytes_reserved, before.bytes_reserved);
  EXPECT_EQ(s.maps, before.maps + 1);
  EXPECT_EQ(s.unmaps, before.unmaps + 1);
  EXPECT_EQ(s.out_of_memory, before.out_of_memory + 1);
  EXPECT_EQ(s.failed_reserves, before.failed_reserves + 1);
  EXPECT_EQ(env.sim->mapped_bytes(), 32 * MiB) << "no mapping of the failed reserve may remain";
  EXPECT_EQ(env.m->usage().number_allocs, 1u);
  env.check();

  auto retry = env.reserve(69 * MiB);
  EXPECT_EQ(env.offset(retry), 32 * MiB);
  EXPECT_EQ(env.stats().maps, before.maps + 1 + 4);
  EXPECT_EQ(env.reserved(), 102 * MiB);
  env.check();
}

// The bytes an arena's out_of_memory reports are what the device holds after the rollback,
// frees of other pools still queued included (the figure a caller compares with the capacity).
TEST(ArenaPool, AFailedMapReportsTheDevicesBytesWithQueuedFreesOfOtherPools) {
  arena_env env("sliced:page=1MiB,slice=64KiB,period=1;arena:space=256MiB");
  {
    auto small = env.reserve(4096);  // a sliced page of 1 MiB
  }
  // Reserves in the arena advance the period; the idle page is released, its free queued.
  for (int i = 0; i < 8 && env.sim->pending_deallocations() == 0; ++i) (void)env.reserve(4 * MiB);
  ASSERT_GT(env.sim->pending_deallocations(), 0u) << "the idle page's free must still be queued";
  ASSERT_GT(env.sim->allocated_bytes(), env.reserved()) << "the device still holds the queued page";

  env.sim->fail_allocation(1);
  auto r = env.m->reserve(16 * MiB);  // the arena must map more, and the device refuses
  ASSERT_FALSE(r);
  EXPECT_EQ(r.code(), errc::out_of_memory);
  EXPECT_EQ(r.err().in_use, env.sim->allocated_bytes()) << r.err().message();
  EXPECT_EQ(env.m->check_invariants(), "");
}

TEST(ArenaPool, AFailedMapPutsTheFreeMappingsUnderTheSliceBack) {
  arena_env env("arena:space=256MiB");
  auto a = env.reserve(4 * MiB);
  auto b = env.reserve(4 * MiB);
  auto c = env.reserve(4 * MiB);
  EXPECT_EQ(env.stats().maps, 3u);
  b.reset();
  c.reset();
  EXPECT_EQ(env.reserved(), 12 * MiB);
  env.check();

  // 10 MiB at 4 MiB reuses B's and C's free mappings and needs one more granule, whose map fails.
  env.sim->fail_allocation(1);
  auto r = env.m->reserve(10 * MiB);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.code(), errc::out_of_memory);
  EXPECT_EQ(r.err().size, 10 * MiB);
  EXPECT_EQ(env.reserved(), 12 * MiB);
  EXPECT_EQ(env.stats().unmaps, 0u);
  env.check();  // the free mappings must be back on the free list

  auto retry = env.reserve(10 * MiB);
  EXPECT_EQ(env.offset(retry), 4 * MiB);
  EXPECT_EQ(env.stats().maps, 4u) << "only granule 6 is new";
  EXPECT_EQ(env.reserved(), 14 * MiB);
  env.check();

  // And the free list still works: nothing is free now, a cleanup unmaps nothing.
  ASSERT_TRUE(env.m->cleanup(true));
  EXPECT_EQ(env.reserved(), 14 * MiB);
  env.check();
}

TEST(ArenaPool, AFailedMapAfterAnEvictionKeepsTheDeviceAndThePoolInAgreement) {
  arena_env env("arena:space=256MiB");
  auto a = env.reserve(32 * MiB);
  auto guard = env.reserve(2 * MiB);
  a.reset();
  EXPECT_EQ(env.reserved(), 34 * MiB);
  // 40 MiB lands after the guard; A's free mapping is unmapped to make room, then the map fails.
  env.sim->fail_allocation(1);
  auto r = env.m->reserve(40 * MiB);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.code(), errc::out_of_memory);
  // The free memory given back before the failure is not mapped again; nothing leaks.
  EXPECT_LE(env.reserved(), 34 * MiB);
  EXPECT_GE(env.reserved(), 2 * MiB);
  EXPECT_EQ(env.m->usage().number_allocs, 1u);
  env.check();
  auto retry = env.reserve(40 * MiB);
  EXPECT_EQ(env.offset(retry), 34 * MiB);
  EXPECT_EQ(env.reserved(), 42 * MiB) << "the guard's granule and the 20 granules of the retry";
  env.check();
}

TEST(ArenaPool, DeviceCapacityRefusalThenReclaimAndRetry) {
  arena_env env("arena:space=256MiB", 64 * MiB);
  auto a = env.reserve(40 * MiB);  // granules 0..19
  auto b = env.reserve(20 * MiB);  // granules 20..29
  EXPECT_EQ(env.reserved(), 60 * MiB);
  // 8 MiB at 60 MiB: granules 30..31 fit the device (64 MiB), granules 32..33 do not.
  auto c = env.m->reserve(8 * MiB);
  ASSERT_FALSE(c);
  EXPECT_EQ(c.code(), errc::out_of_memory);
  EXPECT_EQ(c.err().size, 8 * MiB);
  EXPECT_NE(c.err().message().find("capacity"), std::string::npos) << c.err().message();
  EXPECT_EQ(env.reserved(), 60 * MiB);
  EXPECT_EQ(env.sim->allocated_bytes(), 60 * MiB);
  env.check();

  a.reset();
  ASSERT_TRUE(env.m->reclaim());
  EXPECT_EQ(env.stats().reclaims, 1u);
  EXPECT_EQ(env.reserved(), 20 * MiB);
  EXPECT_EQ(env.sim->mapped_bytes(), 20 * MiB);
  env.check();

  auto retry = env.reserve(8 * MiB);
  EXPECT_EQ(env.offset(retry), 0u) << "the best fit is A's old hole";
  EXPECT_EQ(env.reserved(), 28 * MiB);
  env.check();

  // Larger than the device: refused before any pool is asked.
  auto huge = env.m->reserve(64 * MiB + 1);
  EXPECT_EQ(huge.code(), errc::buffer_too_big);
  env.check();
}

TEST(ArenaPool, AddressSpaceExhaustion) {
  arena_env env("arena:space=256MiB");
  auto big = env.reserve(200 * MiB);
  const std::uint64_t maps = env.stats().maps;

  auto r = env.m->reserve(100 * MiB);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.code(), errc::pool_capacity_exceeded);
  EXPECT_TRUE(is_transient(r.code()));
  EXPECT_EQ(r.err().size, 100 * MiB);
  EXPECT_EQ(r.err().limit, 256 * MiB);
  EXPECT_NE(r.err().message().find("hole"), std::string::npos) << r.err().message();
  EXPECT_NE(r.err().message().find("space"), std::string::npos) << r.err().message();
  EXPECT_EQ(env.stats().maps, maps);
  env.check();

  auto too_big = env.m->reserve(256 * MiB + 1);
  ASSERT_FALSE(too_big);
  EXPECT_EQ(too_big.code(), errc::buffer_too_big);
  EXPECT_EQ(too_big.err().limit, 256 * MiB);

  // The rest of the range exactly; then nothing more fits.
  auto rest = env.reserve(56 * MiB);
  EXPECT_EQ(env.offset(rest), 200 * MiB);
  EXPECT_EQ(env.m->reserve(0).code(), errc::pool_capacity_exceeded);
  env.check();

  big.reset();
  auto again = env.reserve(100 * MiB);
  EXPECT_EQ(env.offset(again), 0u);
  env.check();
}

TEST(ArenaPool, MaxLimitsTheRequestSize) {
  arena_env env("arena:space=256MiB,max=16MiB");
  auto ok = env.reserve(16 * MiB);
  auto no = env.m->reserve(16 * MiB + 1);
  ASSERT_FALSE(no);
  EXPECT_EQ(no.code(), errc::buffer_too_big);
  EXPECT_EQ(no.err().limit, 16 * MiB);
  env.check();
}

TEST(ArenaPool, ReportDescribesTheArena) {
  arena_env env("arena:space=256MiB,slack=4MiB");
  auto a = env.reserve(5 * MiB);
  const std::string rep = env.m->report();
  EXPECT_NE(rep.find("arena pool"), std::string::npos) << rep;
  EXPECT_NE(rep.find("up to 4.00 MiB"), std::string::npos) << rep;
  EXPECT_NE(rep.find("arena:"), std::string::npos) << rep;
}

TEST(ArenaPool, ArenaBesideOtherPools) {
  // Small requests in a capped arena, larger ones in a sliced pool, then a second arena.
  arena_env env("arena:space=64MiB,max=1MiB;sliced:page=64MiB,slice=16MiB;arena:space=256MiB");
  ASSERT_EQ(env.m->layout().size(), 3u);
  auto small = env.reserve(1 * MiB);
  auto medium = env.reserve(8 * MiB);
  auto large = env.reserve(40 * MiB);
  EXPECT_NE(env.m->get_storage(small)->id, env.m->get_storage(large)->id) << "two arenas reserve two ranges";
  EXPECT_EQ(env.sim->range_count(), 2u);
  EXPECT_EQ(env.sim->page_count(), 1u);
  EXPECT_EQ(env.reserved(), kGranule + 64 * MiB + 40 * MiB);
  EXPECT_EQ(env.sim->allocated_bytes(), env.reserved());
  EXPECT_EQ(env.sim->mapped_bytes(), kGranule + 40 * MiB);
  EXPECT_EQ(env.m->check_invariants(), "");

  small.reset();
  medium.reset();
  large.reset();
  ASSERT_TRUE(env.m->cleanup(true));
  EXPECT_EQ(env.sim->mapped_bytes(), 0u);
  EXPECT_EQ(env.m->check_invariants(), "");
  auto applied = env.m->configure(layout_of("sliced:page=16MiB"));
  ASSERT_TRUE(applied);
  EXPECT_TRUE(applied->applied);
  EXPECT_EQ(env.sim->range_count(), 0u);
  EXPECT_EQ(env.sim->allocated_bytes(), 0u);
  EXPECT_EQ(env.reserved(), 0u);
  EXPECT_EQ(env.m->check_invariants(), "");
}

TEST(ArenaPool, HandlesMayOutliveTheManager) {
  memory_handle survivor;
  memory_binding binding;
  {
    arena_env env("arena:space=256MiB");
    survivor = env.reserve(3 * MiB);
    binding = env.reserve(5 * MiB).binding();
    auto dropped = env.reserve(1);
    EXPECT_EQ(env.m->usage().number_allocs, 3u);
  }
  // The manager released every mapping and the range; the handles are safe to copy and drop.
  memory_handle copy = survivor;
  EXPECT_EQ(copy.use_count(), 2u);
  copy.reset();
  survivor.reset();
  binding = memory_binding{};
  SUCCEED();
}

// Reserves and drops under injected map failures, a device capacity below the address space and
// a random slack: whatever fails, the pool stays consistent, the device holds exactly the memory
// the manager counts, a failure leaves the live slices alone and never makes the memory held grow,
// and the free memory kept mapped never exceeds the slack after a drop.
TEST(ArenaRandomized, FailuresAndSlackKeepThePoolConsistent) {
  for (const std::uint64_t seed : {1ULL, 2ULL, 3ULL}) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    const std::uint64_t slack = std::uniform_int_distribution<std::uint64_t>(0, 8)(rng) * kGranule;
    arena_env env("arena:space=512MiB,chunk=8MiB,slack=" + std::to_string(slack), 192 * MiB);
    const double log_max = std::log(static_cast<double>(48 * MiB) + 1.0);
    struct live_slice {
      memory_handle h;
      std::uint64_t first = 0;
      std::uint64_t last = 0;
    };
    std::vector<live_slice> live;
    std::vector<std::uint32_t> on_granule(512 * MiB / kGranule, 0);
    std::uint64_t touched = 0;
    std::uint64_t in_use = 0;
    std::uint64_t device_refusals = 0;
    for (int op = 0; op < 5000; ++op) {
      const std::uint64_t before = env.reserved();
      const double p = unit(rng);
      if (p < 0.01) {
        ASSERT_TRUE(env.m->cleanup(true));
      } else if (live.empty() || p < 0.55) {
        if (unit(rng) < 0.15) env.sim->fail_allocation(std::uniform_int_distribution<std::uint64_t>(1, 3)(rng));
        const auto size = std::min(static_cast<std::uint64_t>(std::exp(unit(rng) * log_max)) - 1, 48 * MiB);
        auto r = env.m->reserve(size);
        if (!r) {
          ASSERT_TRUE(r.code() == errc::out_of_memory || r.code() == errc::pool_capacity_exceeded)
              << "op " << op << ": " << r.err().message();
          ASSERT_EQ(r.err().size, size);
          ASSERT_LE(env.reserved(), before) << "op " << op << ": a failed reserve made the memory held grow";
          ASSERT_EQ(env.m->usage().number_allocs, live.size());
          ASSERT_EQ(env.m->usage().bytes_in_use, in_use);
          if (r.code() == errc::out_of_memory) ++device_refusals;
        } else {
          auto st = env.m->get_storage(*r);
          ASSERT_TRUE(st);
          const std::uint64_t extent = align_up(size == 0 ? 1 : size, kAlign);
          live_slice s{std::move(*r), st->offset / kGranule, (st->offset + extent - 1) / kGranule};
          for (std::uint64_t g = s.first; g <= s.last; ++g) touched += on_granule[g]++ == 0 ? 1 : 0;
          in_use += size;
          live.push_back(std::move(s));
        }
      } else {
        const std::size_t i = std::uniform_int_distribution<std::size_t>(0, live.size() - 1)(rng);
        for (std::uint64_t g = live[i].first; g <= live[i].last; ++g) touched -= --on_granule[g] == 0 ? 1 : 0;
        in_use -= env.m->get_storage(live[i].h)->size;
        std::swap(live[i], live.back());
        live.pop_back();
        (void)env.stats();
        // What the drop left mapped beyond the granules in use is free memory within the slack;
        // mappings shared with live slices (at most a chunk at each end of each slice) aside.
        const std::uint64_t shared = 2 * live.size() * (8 * MiB - kGranule);
        ASSERT_LE(env.reserved(), touched * kGranule + shared + slack) << "op " << op;
      }
      ASSERT_GE(env.reserved(), touched * kGranule) << "op " << op;
      ASSERT_EQ(env.sim->mapped_bytes(), env.reserved()) << "op " << op;
      ASSERT_EQ(env.sim->allocated_bytes(), env.reserved()) << "op " << op;
      ASSERT_EQ(env.sim->misuses(), 0u) << "op " << op;
      const std::string problem = env.m->check_invariants();
      ASSERT_EQ(problem, "") << "op " << op;
    }
    EXPECT_GT(device_refusals, 0u);
    live.clear();
    ASSERT_TRUE(env.m->cleanup(true));
    EXPECT_EQ(env.reserved(), 0u);
    EXPECT_EQ(env.sim->mapped_bytes(), 0u);
  }
}

// ---- Layouts ----

TEST(ArenaLayout, ArenaNeedsAMappingDevice) {
  const device_properties plain = plain_props();
  for (const char* text : {"arena:", "arena:space=1GiB", "sliced:page=64MiB;arena:"}) {
    SCOPED_TRACE(text);
    auto r = resolve_layout(layout_of(text), plain);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.code(), errc::mapping_unsupported);
    EXPECT_TRUE(is_config_error(r.code()));
    EXPECT_NE(r.err().message().find("cannot"), std::string::npos) << r.err().message();
  }
  EXPECT_EQ(resolve_layout(layout_of("sliced:page=64MiB;arena:"), plain).err().text, "pool 1");
  EXPECT_EQ(resolve_layout(preset::arena, plain).code(), errc::mapping_unsupported);
  EXPECT_EQ(resolve_layout(layout_of("arena"), plain).code(), errc::mapping_unsupported);

  // Through the manager: the default sim device cannot map.
  for (const memory_layout& l : {layout_of("arena:"), memory_layout(preset::arena)}) {
    auto m = memory_manager::create(storage::make<sim_storage>(sim_options{}), options_of(l));
    ASSERT_FALSE(m);
    EXPECT_EQ(m.code(), errc::mapping_unsupported);
  }
  EXPECT_THROW(memory_manager(storage::make<sim_storage>(sim_options{}), options_of(preset::arena)), exception);
}

TEST(ArenaLayout, ZeroSizesNameTheField) {
  const device_properties props = mapping_props();
  const std::pair<const char*, const char*> cases[] = {{"arena:granule=0", "granule"},
                                                       {"arena:chunk=0", "chunk"},
                                                       {"arena:space=0", "address_space"},
                                                       {"arena:max=0", "max_alloc_size"}};
  for (const auto& [text, field] : cases) {
    SCOPED_TRACE(text);
    auto r = resolve_layout(layout_of(text), props);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.code(), errc::zero_size);
    EXPECT_EQ(std::string(r.err().detail), field);
    EXPECT_NE(r.err().message().find(std::string("`") + field + "`"), std::string::npos) << r.err().message();
  }
  // slack=0 is valid: it means "keep nothing".
  EXPECT_TRUE(resolve_layout(layout_of("arena:slack=0"), props));
}

TEST(ArenaLayout, MaxLargerThanTheAddressSpace) {
  const device_properties props = mapping_props();
  auto r = resolve_layout(layout_of("arena:max=512MiB,space=256MiB"), props);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.code(), errc::slice_larger_than_page);
  EXPECT_EQ(r.err().size, 512 * MiB);
  EXPECT_EQ(r.err().limit, 256 * MiB);
  EXPECT_NE(r.err().message().find("address space"), std::string::npos) << r.err().message();
  // Equal is fine; the space rounds up to whole granules first.
  EXPECT_TRUE(resolve_layout(layout_of("arena:max=256MiB,space=256MiB"), props));
  EXPECT_TRUE(resolve_layout(layout_of("arena:max=256MiB,space=255MiB"), props));
  // Without a space the default (four times the device memory) applies.
  EXPECT_TRUE(resolve_layout(layout_of("arena:max=4GiB"), mapping_props(1 * GiB)));
  auto d = resolve_layout(layout_of("arena:max=5GiB"), mapping_props(1 * GiB));
  ASSERT_FALSE(d);
  EXPECT_EQ(d.code(), errc::slice_larger_than_page);
  EXPECT_EQ(d.err().limit, 4 * GiB);
}

TEST(ArenaLayout, MalformedArenaStrings) {
  for (const char* text : {"arena:foo=1MiB", "arena:granule", "arena:granule=2MiB,size=1GiB", "arenas:space=1GiB"}) {
    SCOPED_TRACE(text);
    auto r = parse_layout(text);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.code(), errc::malformed_layout) << r.err().message();
  }
  auto bad = parse_layout("arena:granule=2 parsecs");
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.code(), errc::malformed_size);
}

TEST(ArenaLayout, StringsRoundTrip) {
  for (const char* text :
       {"arena", "arena:granule=4MiB,chunk=64MiB,max=1GiB,space=256GiB,slack=64MiB", "arena:space=256MiB",
        "arena:slack=0", "arena:max=1000", "arena:granule=2MiB;sliced:page=64MiB", "exclusive:max=0;arena"}) {
    SCOPED_TRACE(text);
    auto l = parse_layout(text);
    ASSERT_TRUE(l) << l.err().message();
    EXPECT_EQ(to_string(*l), text);
    auto again = parse_layout(to_string(*l));
    ASSERT_TRUE(again);
    EXPECT_EQ(to_string(*again), text);
  }
  // Keys are case-insensitive, spaces are allowed, and the text comes back in canonical order.
  auto l = parse_layout(" arena: Space = 1GiB , GRANULE=4MiB ");
  ASSERT_TRUE(l);
  EXPECT_EQ(to_string(*l), "arena:granule=4MiB,space=1GiB");
  // "arena:" without keys prints as the preset, which resolves to the same pool.
  auto bare = parse_layout("arena:");
  ASSERT_TRUE(bare);
  EXPECT_EQ(to_string(*bare), "arena");
  const device_properties props = mapping_props(4 * GiB);
  EXPECT_EQ(resolve_layout(*bare, props).value(), resolve_layout(layout_of(to_string(*bare)), props).value());
}

TEST(ArenaLayout, SizesNearTheTopOfTheRangeDoNotWrap) {
  // Each size rounds up past 2^64 when aligned to the granule (or the alignment): the layout must
  // be refused, or resolve to pools at least as large as written, never crash or shrink.
  const device_properties props = mapping_props(1 * GiB);
  for (const char* text : {"arena:granule=18446744073709551615", "arena:space=18446744073709551615",
                           "arena:max=18446744073709551615", "arena:chunk=18446744073709551615"}) {
    SCOPED_TRACE(text);
    auto r = resolve_layout(layout_of(text), props);
    if (!r) {
      EXPECT_TRUE(is_config_error(r.code())) << r.err().message();
      continue;
    }
    const pool_options& o = r->front();
    EXPECT_GE(o.page_size, kGranule);
    EXPECT_GE(o.max_pool_size.value_or(0), o.page_size);
    EXPECT_NE(o.max_alloc_size, 0u);
    EXPECT_GE(o.chunk.value_or(0), o.page_size);
  }
}

TEST(ArenaLayout, ResolvedValues) {
  const device_properties props = mapping_props(1 * GiB);
  auto r = resolve_layout(layout_of("arena:granule=3MiB,chunk=5MiB,space=100MiB,slack=1MiB,max=10MiB"), props);
  ASSERT_TRUE(r) << r.err().message();
  ASSERT_EQ(r->size(), 1u);
  const pool_options& o = r->front();
  EXPECT_EQ(o.kind, pool_kind::arena);
  EXPECT_EQ(o.page_size, 4 * MiB) << "the granule rounds up to the device's";
  EXPECT_EQ(o.chunk.value_or(0), 8 * MiB) << "the chunk rounds up to the granule";
  EXPECT_EQ(o.max_pool_size.value_or(0), 100 * MiB);
  EXPECT_EQ(o.max_alloc_size, 10 * MiB);
  EXPECT_EQ(o.slack.value_or(0), 1 * MiB);

  auto d = resolve_layout(layout_of("arena:"), props);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->front().page_size, kGranule);
  EXPECT_EQ(d->front().chunk.value_or(0), 32 * MiB);
  EXPECT_EQ(d->front().max_pool_size.value_or(0), 4 * GiB);
  EXPECT_EQ(d->front().max_alloc_size, no_size_limit);
  EXPECT_FALSE(d->front().slack.has_value());

  auto unknown_capacity = resolve_layout(layout_of("arena:"), mapping_props(0));
  ASSERT_TRUE(unknown_capacity);
  EXPECT_EQ(unknown_capacity->front().max_pool_size.value_or(0), 64 * GiB);

  auto coarse = resolve_layout(layout_of("arena:granule=64MiB"), props);
  ASSERT_TRUE(coarse);
  EXPECT_EQ(coarse->front().chunk.value_or(0), 64 * MiB) << "a chunk is at least one granule";
}

TEST(ArenaLayout, AutomaticPicksTheArenaOnMappingDevices) {
  const device_properties mapping = mapping_props(8 * GiB);
  const device_properties plain = plain_props(8 * GiB);
  auto on_mapping = resolve_layout(preset::automatic, mapping);
  ASSERT_TRUE(on_mapping);
  ASSERT_EQ(on_mapping->size(), 1u);
  EXPECT_EQ(on_mapping->front().kind, pool_kind::arena);
  EXPECT_EQ(on_mapping->front().page_size, kGranule);
  EXPECT_EQ(on_mapping->front().max_pool_size.value_or(0), 32 * GiB);
  EXPECT_EQ(*on_mapping, resolve_layout(preset::arena, mapping).value());
  EXPECT_EQ(*on_mapping, preset_pools(preset::automatic, mapping));

  auto on_plain = resolve_layout(preset::automatic, plain);
  ASSERT_TRUE(on_plain);
  EXPECT_EQ(*on_plain, preset_pools(preset::sub_slices, plain));
  EXPECT_TRUE(std::none_of(on_plain->begin(), on_plain->end(),
                           [](const pool_options& o) { return o.kind == pool_kind::arena; }));

  // The manager's default layout follows the device.
  memory_manager mapped(storage::make<sim_storage>(mapping_sim()), manager_options{});
  ASSERT_EQ(mapped.layout().size(), 1u);
  EXPECT_EQ(mapped.layout().front().kind, pool_kind::arena);
  memory_manager sliced(storage::make<sim_storage>(sim_options{}), manager_options{});
  EXPECT_EQ(sliced.layout(), preset_pools(preset::sub_slices, sim_options{}.props));
}

// ---- Configure ----

TEST(ArenaPool, ConfigureBetweenArenaAndSlicedLayouts) {
  arena_env env("arena:space=256MiB");
  auto a = env.reserve(10 * MiB);
  EXPECT_EQ(env.sim->range_count(), 1u);

  // Kept while the arena holds a live slice.
  auto kept = env.m->configure(layout_of("sliced:page=64MiB"));
  ASSERT_TRUE(kept) << kept.err().message();
  EXPECT_FALSE(kept->applied);
  EXPECT_EQ(kept->live_bytes, 10 * MiB);
  EXPECT_EQ(kept->live_allocations, 1u);
  EXPECT_EQ(env.m->layout().front().kind, pool_kind::arena);
  EXPECT_TRUE(env.m->get_resource(a));
  env.check();

  // Applied once nothing is live: the mappings and the address range go back to the device.
  a.reset();
  auto applied = env.m->configure(layout_of("sliced:page=64MiB"));
  ASSERT_TRUE(applied) << applied.err().message();
  EXPECT_TRUE(applied->applied);
  EXPECT_EQ(env.m->layout().front().kind, pool_kind::sliced);
  EXPECT_EQ(env.sim->range_count(), 0u);
  EXPECT_EQ(env.sim->mapped_bytes(), 0u);
  EXPECT_EQ(env.reserved(), 0u);
  env.check();

  auto s = env.reserve(1 * MiB);
  EXPECT_EQ(env.reserved(), 64 * MiB);
  EXPECT_EQ(env.sim->page_count(), 1u);
  auto back = env.m->configure(layout_of("arena:space=128MiB"));
  ASSERT_TRUE(back);
  EXPECT_FALSE(back->applied) << "a live sliced allocation keeps the sliced layout";
  s.reset();
  back = env.m->configure(layout_of("arena:space=128MiB"));
  ASSERT_TRUE(back);
  EXPECT_TRUE(back->applied);
  EXPECT_EQ(env.sim->page_count(), 0u);
  EXPECT_EQ(env.reserved(), 0u);
  auto b = env.reserve(3 * MiB);
  EXPECT_EQ(env.sim->range_count(), 1u);
  EXPECT_EQ(env.reserved(), 4 * MiB);
  env.check();

  // Arena to arena: the old range is released when the new pool replaces it.
  b.reset();
  auto other = env.m->configure(layout_of("arena:space=64MiB,granule=4MiB"));
  ASSERT_TRUE(other);
  EXPECT_TRUE(other->applied);
  EXPECT_EQ(env.sim->range_count(), 0u);
  auto c = env.reserve(1);
  EXPECT_EQ(env.reserved(), 4 * MiB);
  EXPECT_EQ(env.sim->range_count(), 1u);
  env.check();

  // An arena layout on a device that cannot map is refused by configure, and nothing changes.
  auto m2 = std::make_unique<memory_manager>(storage::make<sim_storage>(sim_options{}), options_of(preset::sub_slices));
  EXPECT_EQ(m2->configure(layout_of("arena:")).code(), errc::mapping_unsupported);
  EXPECT_EQ(m2->layout(), preset_pools(preset::sub_slices, sim_options{}.props));
}

// ---- Randomized ----

// Reserves and drops of log-uniform sizes from 0 to 64 MiB, with occasional explicit cleanups,
// checked against a model of the granules the live slices touch.
//
// The bound on the memory held: let touched(t) be the bytes of granules under live slices and
// live(t) their number. Memory is mapped in mappings of at most one chunk. A mapping that a live
// slice overlaps but does not cover with the other live slices holds the first or the last granule
// of a live slice (a live slice overlapping it stops inside it), so at most 2 * live(t) mappings
// hold granules no live slice touches, each at most chunk - granule bytes of them. Hence the
// memory of the mappings in use is at most
//     bound(t) = touched(t) + 2 * live(t) * (chunk - granule).
// A reserve that maps memory first unmaps free mappings elsewhere, as many granules as it maps; so
// either the memory held does not grow, or no free mapping is left and everything held is in use
// (at most bound(t)). Releases and cleanups only unmap. Therefore:
//   - after a reserve that made the memory held grow, it is at most bound(t);
//   - after an explicit cleanup, it is at most bound(t);
//   - at any time, and for the peak, it is at most the maximum of bound over the past;
//   - it is at least touched(t): every granule under a live slice is mapped.
TEST(ArenaRandomized, MemoryHeldStaysWithinTheBoundOfLiveSlices) {
  constexpr std::uint64_t space = 512 * MiB;
  constexpr std::uint64_t chunk = 32 * MiB;
  constexpr int ops = 20000;
  arena_env env("arena:space=512MiB");
  std::mt19937_64 rng(0x5eed'a7e4aULL);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const double log_max = std::log(static_cast<double>(64 * MiB) + 1.0);

  struct live_slice {
    memory_handle h;
    std::uint64_t first = 0;  // granules
    std::uint64_t last = 0;
  };
  std::vector<live_slice> live;
  std::vector<std::uint32_t> on_granule(space / kGranule, 0);
  std::uint64_t touched = 0;  // granules under live slices
  std::uint64_t max_bound = 0;
  std::uint64_t grew_checks = 0;
  std::uint64_t successes = 0;
  std::uint64_t no_hole = 0;
  auto bound = [&] { return touched * kGranule + 2 * live.size() * (chunk - kGranule); };

  for (int op = 0; op < ops; ++op) {
    const double p = unit(rng);
    const std::uint64_t before = env.reserved();
    // Aim at about 24 live slices: reserve more often when there are fewer.
    const double reserve_chance = live.size() < 24 ? 0.7 : 0.3;
    if (p < 0.01) {
      ASSERT_TRUE(env.m->cleanup(true));
      EXPECT_LE(env.reserved(), bound()) << "op " << op << ": after a cleanup every mapping is in use";
    } else if (live.empty() || unit(rng) < reserve_chance) {
      std::uint64_t size = static_cast<std::uint64_t>(std::exp(unit(rng) * log_max)) - 1;
      if (unit(rng) < 0.03) size = 0;
      size = std::min(size, 64 * MiB);
      auto r = env.m->reserve(size);
      if (!r) {
        ASSERT_EQ(r.code(), errc::pool_capacity_exceeded) << "op " << op << ": " << r.err().message();
        ASSERT_NE(r.err().message().find("hole"), std::string::npos) << r.err().message();
        ASSERT_LE(env.reserved(), before) << "op " << op << ": a reserve without a hole maps nothing";
        ++no_hole;
      } else {
        ++successes;
        auto st = env.m->get_storage(*r);
        ASSERT_TRUE(st);
        ASSERT_EQ(st->size, size);
        const std::uint64_t extent = align_up(size == 0 ? 1 : size, kAlign);
        ASSERT_LE(st->offset + extent, space);
        live_slice s{std::move(*r), st->offset / kGranule, (st->offset + extent - 1) / kGranule};
        for (std::uint64_t g = s.first; g <= s.last; ++g) touched += on_granule[g]++ == 0 ? 1 : 0;
        live.push_back(std::move(s));
        max_bound = std::max(max_bound, bound());
        if (env.reserved() > before) {
          ++grew_checks;
          ASSERT_LE(env.reserved(), bound()) << "op " << op << ": the memory held grew while free mappings were left ("
                                             << live.size() << " live slices, " << touched << " granules touched)";
        }
      }
    } else {
      std::uniform_int_distribution<std::size_t> pick(0, live.size() - 1);
      const std::size_t i = pick(rng);
      for (std::uint64_t g = live[i].first; g <= live[i].last; ++g) touched -= --on_granule[g] == 0 ? 1 : 0;
      std::swap(live[i], live.back());
      live.pop_back();
      (void)env.stats();
      ASSERT_EQ(env.reserved(), before) << "op " << op << ": without a slack a drop unmaps nothing";
    }
    const std::uint64_t held = env.reserved();
    ASSERT_GE(held, touched * kGranule) << "op " << op << ": a granule under a live slice is not mapped";
    ASSERT_LE(held, max_bound) << "op " << op;
    ASSERT_EQ(env.sim->mapped_bytes(), held) << "op " << op;
    const std::string problem = env.m->check_invariants();
    ASSERT_EQ(problem, "") << "op " << op;
  }
  const memory_statistics s = env.stats();
  EXPECT_LE(s.peak_bytes_reserved, max_bound);
  EXPECT_GT(successes, static_cast<std::uint64_t>(ops) / 4);
  EXPECT_GT(grew_checks, 0u);
  EXPECT_EQ(env.sim->misuses(), 0u);
  RecordProperty("reserves", static_cast<int>(successes));
  RecordProperty("no_hole", static_cast<int>(no_hole));

  live.clear();
  ASSERT_TRUE(env.m->cleanup(true));
  EXPECT_EQ(env.reserved(), 0u);
  EXPECT_EQ(env.sim->mapped_bytes(), 0u);
  EXPECT_EQ(env.m->check_invariants(), "");
}

}  // namespace

namespace {

// A request that needs two mappings where the device grants only the first: the first is given
// back, and the error reports what devrt holds after that, not at the refusal.
TEST(ArenaPool, ARefusedSecondMappingReportsWhatIsHeldAfterTheRollback) {
  arena_env env("arena");
  env.sim->fail_allocation(2);                    // the second map call of the next reserve
  auto r = env.m->reserve(13 * kGranule + 1000);  // 13 whole granules, then a last one of its own
  ASSERT_FALSE(r);
  EXPECT_EQ(r.code(), devrt::errc::out_of_memory);
  EXPECT_EQ(r.err().in_use, 0u) << r.err().message();
  EXPECT_EQ(env.reserved(), 0u);
  env.check();
  EXPECT_TRUE(env.m->reserve(13 * kGranule + 1000)) << "a retry succeeds";
  env.check();
}

// ---- Near the memory limit: where a slice adds the fewest granules ----

// Holes for the tests below (layout "arena:space=256MiB,grow=0"), in MiB: [0,2) free and
// unmapped; a guard at [2,4); L at [4,5); [5,11) free, its granules 3 and 4 unmapped, granules 2
// and 5 mapped and pinned by L and R; R at [11,12); a guard at [12,14). 8 MiB mapped, none free.
struct pinned_holes {
  memory_handle guard1, left, right, guard2;
  explicit pinned_holes(arena_env& env) {
    auto x = env.reserve(2 * MiB);
    guard1 = env.reserve(2 * MiB);
    left = env.reserve(1 * MiB);
    auto h = env.reserve(6 * MiB);
    right = env.reserve(1 * MiB);
    guard2 = env.reserve(2 * MiB);
    EXPECT_EQ(env.offset(h), 5 * MiB);
    EXPECT_EQ(env.offset(right), 11 * MiB);
    x.reset();
    h.reset();
    EXPECT_TRUE(env.m->cleanup(true));
    EXPECT_EQ(env.reserved(), 8 * MiB) << "granules 1, 2, 5 and 6";
    env.check();
  }
};

TEST(ArenaPool, AtTheLimitASliceTakesMappedFreeMemoryTheBestFitPassedOver) {
  arena_env env("arena:space=256MiB,grow=0");
  pinned_holes holes(env);
  ASSERT_TRUE(env.m->set_memory_limit(8 * MiB));
  const std::uint64_t maps = env.stats().maps;

  // The best fit, [0,2), would map a granule past the limit; the front of [5,11) lies in granule 2.
  auto a = env.reserve(1 * MiB);
  EXPECT_EQ(env.offset(a), 5 * MiB);
  // The front of what is left, [6,11), would map granule 3; its back lies in granule 5.
  auto b = env.reserve(1 * MiB);
  EXPECT_EQ(env.offset(b), 10 * MiB);
  EXPECT_EQ(env.stats().maps, maps) << "both in memory already mapped";
  EXPECT_EQ(env.reserved(), 8 * MiB);
  env.check();

  // No placement is left that maps nothing: refused at the limit, and nothing is lost.
  auto c = env.m->reserve(1 * MiB);
  ASSERT_FALSE(c);
  EXPECT_EQ(c.code(), errc::out_of_memory);
  EXPECT_NE(c.err().message().find("memory limit"), std::string::npos) << c.err().message();
  EXPECT_EQ(env.reserved(), 8 * MiB);
  EXPECT_EQ(env.m->usage().number_allocs, 6u);
  env.check();

  // The back slice frees into its hole, which merges whole again.
  b.reset();
  a.reset();
  holes.right.reset();
  holes.left.reset();
  env.check();
  ASSERT_TRUE(env.m->set_memory_limit(0));
  auto whole = env.reserve(8 * MiB);
  EXPECT_EQ(env.offset(whole), 4 * MiB) << "[4,12) is one hole again";
  env.check();
}

TEST(ArenaPool, ARefusedMapIsTriedOnceMoreWhereTheSliceAddsFewerGranules) {
  // No limit: the device refuses the map of the best fit, [0,2).
  arena_env env("arena:space=256MiB,grow=0");
  pinned_holes holes(env);
  const memory_statistics before = env.stats();
  env.sim->fail_allocation(1);
  auto a = env.reserve(1 * MiB);
  EXPECT_EQ(env.offset(a), 5 * MiB) << "refused at [0,2), served in granule 2";
  EXPECT_EQ(env.stats().maps, before.maps);
  EXPECT_EQ(env.stats().out_of_memory, before.out_of_memory + 1);
  EXPECT_EQ(env.stats().failed_reserves, before.failed_reserves);
  env.check();

  // Where every placement needs new memory, a refusal stands: the same map is not tried twice.
  env.sim->fail_allocation(1);
  auto big = env.m->reserve(4 * MiB);
  ASSERT_FALSE(big);
  EXPECT_EQ(big.code(), errc::out_of_memory);
  EXPECT_EQ(env.stats().out_of_memory, before.out_of_memory + 2);
  EXPECT_EQ(env.reserved(), 8 * MiB);
  env.check();
  auto retry = env.reserve(4 * MiB);
  EXPECT_EQ(env.offset(retry), 6 * MiB);
  EXPECT_EQ(env.reserved(), 12 * MiB) << "granules 3 and 4 mapped again";
  env.check();
}

}  // namespace

TEST(ArenaLayout, SmallAllocationsBetweenBuffersOfMostOfTheDeviceLeaveAHoleForTheNext) {
  // On an H200 (140 GB), buffers of about 100 GB one at a time with 1 KiB allocations that outlive
  // them. With an address space of twice the device, three of the small ones cut it into pieces
  // smaller than 100 GB and the last buffer failed (pool_capacity_exceeded) with 3 KiB live; the
  // default space is four times the device.
  memory_manager m(storage::make<sim_storage>(sim_options::h200()), manager_options{"sim", preset::automatic});
  struct event {
    int id;
    std::uint64_t size;  // 0: free `id`
  };
  // clang-format off
  const event events[] = {
      {0, 99'999'999'999}, {1, 1048}, {0, 0}, {2, 99'857'989'632}, {3, 1048}, {2, 0},
      {4, 100'000'000'001}, {5, 1048}, {3, 0}, {1, 0}, {6, 1048}, {4, 0},
      {5, 0}, {7, 101'000'000'000}, {8, 1048}, {7, 0}, {9, 99'999'999'999}, {10, 1048},
      {9, 0}, {11, 100'000'000'001}, {10, 0}, {6, 0}, {11, 0}, {8, 0}};
  // clang-format on
  std::vector<memory_handle> live(12);
  for (const event& e : events) {
    if (e.size == 0) {
      live[static_cast<std::size_t>(e.id)].reset();
      continue;
    }
    auto r = m.reserve(e.size);
    ASSERT_TRUE(r) << "allocation " << e.id << ": " << r.err().message();
    live[static_cast<std::size_t>(e.id)] = std::move(*r);
  }
  EXPECT_EQ(m.usage().bytes_in_use, 0u);
  EXPECT_EQ(m.check_invariants(), "");
}

TEST(ArenaLayout, AnAddressSpaceTheDeviceRefusesIsHalvedUntilItIsGranted) {
  // The simulated device grants ranges of at most 2^48 bytes. With 2^47 bytes of memory the default
  // space (four times that) is refused, half of it is granted, and the arena serves from it.
  sim_options o;
  o.props = device_properties{std::uint64_t{1} << 40, 512, std::uint64_t{1} << 47, 2 * MiB};
  memory_manager m(storage::make<sim_storage>(o), manager_options{"sim", preset::automatic});
  auto r = m.reserve(3 * MiB);
  ASSERT_TRUE(r) << r.err().message();
  EXPECT_NE(m.report().find("address space 256.00 TiB"), std::string::npos) << m.report();
  EXPECT_EQ(m.check_invariants(), "");

  // Refused at every size tried (a quarter is still more than the device grants): the error is the
  // first refusal's, and nothing is left behind.
  sim_options big = o;
  big.props.capacity = std::uint64_t{1} << 50;
  memory_manager n(storage::make<sim_storage>(big), manager_options{"sim", preset::automatic});
  auto f = n.reserve(3 * MiB);
  ASSERT_FALSE(f);
  EXPECT_EQ(f.code(), errc::out_of_memory) << f.err().message();
  EXPECT_EQ(f.err().size, std::uint64_t{1} << 52);
  EXPECT_EQ(n.usage().bytes_in_use, 0u);
  EXPECT_EQ(n.check_invariants(), "");
}

TEST(ArenaPool, BuffersInTurnOverMoreThanTheShareStopRemappingFarFromTheBudget) {
  // 1 GiB and 3 GiB buffers in turn, two live, on an idle simulated H200: the holes they leave
  // cycle over more addresses than 1.10 times the peak of live bytes keeps mapped, so at that share
  // every reserve unmaps half a GiB that the next one maps again (10,088 maps in 1,000 reserves).
  // The churn raises the share, and the driver calls stop.
  memory_manager m(storage::make<sim_storage>(sim_options::h200()), manager_options{"sim", preset::automatic});
  std::vector<memory_handle> live;
  std::uint64_t maps_at_half = 0;
  for (int i = 0; i < 400; ++i) {
    if (i == 200) maps_at_half = m.statistics().maps;
    auto r = m.reserve(i % 2 == 0 ? GiB : 3 * GiB);
    ASSERT_TRUE(r) << r.err().message();
    live.push_back(std::move(*r));
    if (live.size() > 2) live.erase(live.begin());
  }
  const auto& st = m.statistics();
  EXPECT_LE(st.maps - maps_at_half, 8u) << "maps in the second half of the run";
  // What it keeps for that is bounded: at most twice the peak of live bytes (5 GiB).
  EXPECT_LE(st.peak_bytes_reserved, 10 * GiB);
  // The report names the share it keeps now.
  const std::string report = m.report();
  EXPECT_NE(report.find("(the share far from it now "), std::string::npos) << report;
  EXPECT_EQ(m.check_invariants(), "");

  // A configure (here to the same layout, once nothing is live) starts from the base share: what
  // the churn taught was about the workload before it.
  live.clear();
  auto c = m.configure(layout_of("auto"));
  ASSERT_TRUE(c) << c.err().message();
  EXPECT_TRUE(c->applied);
  auto again = m.reserve(GiB);
  ASSERT_TRUE(again) << again.err().message();
  const std::string after = m.report();
  EXPECT_EQ(after.find("(the share far from it now "), std::string::npos) << after;
  EXPECT_EQ(m.check_invariants(), "");
}
