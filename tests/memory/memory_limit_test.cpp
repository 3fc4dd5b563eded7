// The memory limit and the budget policy of the arena: a reserve that would take what the device
// holds past the limit fails with out_of_memory that names the limit, and nothing is lost; a
// lower limit gives free memory back at once; far from the budget (the limit, else the device's
// capacity) the arena keeps free memory mapped and maps ahead in larger units (fewer maps, no
// unmaps), near it it trims as tightly as before, and a workload capped just above its peak of
// live bytes completes within the cap.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "devrt/devices/sim_storage.hpp"
#include "devrt/memory/memory_manager.hpp"

using namespace devrt;
using namespace devrt::memory;

namespace {

constexpr std::uint64_t mib = 1ULL << 20;
constexpr std::uint64_t gib = 1ULL << 30;

std::unique_ptr<memory_manager> manager(std::uint64_t capacity, std::uint64_t limit) {
  devices::sim_options o;
  o.props.map_granularity = 2 * mib;
  o.props.capacity = capacity;
  manager_options opts;
  opts.name = "sim";
  opts.reclaim_on_out_of_memory = true;
  opts.memory_limit = limit;
  return std::make_unique<memory_manager>(storage::make<devices::sim_storage>(o), opts);
}

struct outcome {
  std::uint64_t maps = 0;
  std::uint64_t unmaps = 0;
  std::uint64_t peak_reserved = 0;
  std::uint64_t peak_live = 0;
  std::uint64_t failures = 0;
};

// A training-like loop: each step allocates activations of mixed sizes, frees most of them in
// another order, and keeps a few (a growing set of long-lived tensors), so that holes open and
// close.
outcome run_workload(memory_manager& m) {
  std::mt19937_64 rng(7);
  std::vector<memory_handle> kept;
  for (int step = 0; step < 40; ++step) {
    std::vector<memory_handle> acts;
    for (int i = 0; i < 24; ++i) {
      const std::uint64_t size = (1 + rng() % 48) * mib + rng() % 4096;
      auto r = m.reserve(size);
      if (!r) {
        EXPECT_EQ(r.code(), errc::out_of_memory) << r.err().message();
        continue;
      }
      acts.push_back(std::move(*r));
    }
    std::shuffle(acts.begin(), acts.end(), rng);
    if (step % 4 == 0 && !acts.empty()) {
      kept.push_back(std::move(acts.back()));
      acts.pop_back();
    }
    acts.clear();
  }
  const memory_statistics& st = m.statistics();
  outcome o;
  o.maps = st.maps;
  o.unmaps = st.unmaps;
  o.peak_reserved = st.peak_bytes_reserved;
  o.peak_live = st.peak_bytes_in_use;
  o.failures = st.failed_reserves;
  EXPECT_EQ(m.check_invariants(), "");
  return o;
}

}  // namespace

TEST(MemoryLimit, AReservePastTheLimitFailsNamingItAndNothingIsLost) {
  auto m = manager(0, 64 * mib);
  EXPECT_EQ(m->memory_limit(), 64 * mib);
  auto a = m->reserve(40 * mib).value();
  auto refused = m->reserve(30 * mib);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.code(), errc::out_of_memory);
  const std::string text = refused.err().message();
  EXPECT_NE(text.find("memory limit"), std::string::npos) << text;
  EXPECT_NE(text.find("hint: the memory limit (64.00 MiB) is reached"), std::string::npos) << text;
  EXPECT_EQ(m->check_invariants(), "");
  EXPECT_LE(m->statistics().peak_bytes_reserved, 64 * mib);
  EXPECT_EQ(m->usage().number_allocs, 1u) << "the refused reserve left nothing behind";
  a.reset();
  auto b = m->reserve(30 * mib);
  ASSERT_TRUE(b) << "with the first freed, the second fits: " << b.err().message();
  EXPECT_LE(m->statistics().peak_bytes_reserved, 64 * mib);
  EXPECT_EQ(m->check_invariants(), "");
}

TEST(MemoryLimit, ALowerLimitGivesFreeMemoryBackAtOnceAndZeroLiftsIt) {
  auto m = manager(0, 0);
  auto a = m->reserve(16 * mib).value();
  {
    auto b = m->reserve(16 * mib).value();
    auto c = m->reserve(16 * mib).value();
  }
  ASSERT_GE(m->statistics().bytes_reserved, 48 * mib) << "free memory stays mapped without a limit";
  ASSERT_TRUE(m->set_memory_limit(20 * mib));
  EXPECT_LE(m->statistics().bytes_reserved, 20 * mib) << "the free memory went back";
  EXPECT_EQ(m->usage().number_allocs, 1u);
  auto over = m->reserve(8 * mib);
  ASSERT_FALSE(over);
  EXPECT_EQ(over.code(), errc::out_of_memory);
  ASSERT_TRUE(m->set_memory_limit(0));
  EXPECT_EQ(m->memory_limit(), 0u);
  EXPECT_TRUE(m->reserve(8 * mib)) << "no limit: served again";
  EXPECT_EQ(m->check_invariants(), "");
}

// A limit lowered below live memory: what is freed later goes back rather than serve reserves past
// the limit, on the device's stream and on a client stream alike (there once its fence has
// passed: the memory may not be handed to another stream before).
TEST(MemoryLimit, ALimitBelowLiveMemoryHoldsOnceTheMemoryIsFreedOnAnyStream) {
  constexpr stream_id a_stream = 0x1000;
  constexpr stream_id b_stream = 0x2000;
  constexpr stream_id c_stream = 0x3000;
  for (const stream_id freed_on : {streams::device, a_stream}) {
    SCOPED_TRACE(freed_on == streams::device ? "the device's stream" : "a client stream");
    devices::sim_options o;
    o.streams = true;
    o.props.map_granularity = 2 * mib;
    auto store = storage::make<devices::sim_storage>(o);
    devices::sim_storage* sim = store.backend<devices::sim_storage>();
    manager_options opts;
    opts.name = "sim";
    memory_manager m(std::move(store), opts);
    auto other = m.reserve(4096, b_stream).value();  // a second stream: frees are stream-tagged
    std::vector<memory_handle> live;
    for (int i = 0; i < 6; ++i) live.push_back(m.reserve(10 * mib, freed_on).value());
    ASSERT_TRUE(m.set_memory_limit(16 * mib));
    live.clear();
    m.want_fences();
    ASSERT_TRUE(m.end_batch());
    sim->progress();  // every stream has passed the frees
    ASSERT_TRUE(m.end_batch());
    EXPECT_LE(m.statistics().bytes_reserved, 16 * mib);
    std::vector<memory_handle> again;
    int served = 0;
    for (int i = 0; i < 6; ++i) {
      auto r = m.reserve(10 * mib, c_stream);
      if (r) {
        ++served;
        again.push_back(std::move(*r));
      } else {
        EXPECT_EQ(r.code(), errc::out_of_memory) << r.err().message();
      }
    }
    EXPECT_EQ(served, 1) << "10 MiB fits a 16 MiB limit once";
    EXPECT_LE(m.statistics().bytes_in_use, 16 * mib);
    EXPECT_EQ(m.check_invariants(), "");
  }
}

TEST(MemoryLimit, FarFromTheBudgetTheArenaMapsLessAndUnmapsNothingNearItItTrims) {
  // No capacity and no limit: no budget, the tight policy. A device of 64 GiB: far from it.
  auto tight = manager(0, 0);
  const outcome t = run_workload(*tight);
  auto roomy = manager(64 * gib, 0);
  const outcome r = run_workload(*roomy);
  EXPECT_EQ(t.failures, 0u);
  EXPECT_EQ(r.failures, 0u);
  EXPECT_EQ(r.peak_live, t.peak_live);
  EXPECT_LT(r.maps, t.maps) << "far from the budget the arena maps less";
  EXPECT_LE(r.unmaps, t.unmaps);
  EXPECT_LE(static_cast<double>(t.peak_reserved), 1.05 * static_cast<double>(t.peak_live) + 64.0 * mib);
  EXPECT_LE(static_cast<double>(r.peak_reserved), 1.15 * static_cast<double>(r.peak_live) + 128.0 * mib)
      << "and keeps within its looser share of the peak of live bytes";
  // The same device capped just above the peak of live bytes: tight again, within the cap.
  std::printf("tight: %llu maps, %llu unmaps, peak reserved %.3f of live; roomy: %llu maps, %llu unmaps, %.3f\n",
              static_cast<unsigned long long>(t.maps), static_cast<unsigned long long>(t.unmaps),
              static_cast<double>(t.peak_reserved) / static_cast<double>(t.peak_live),
              static_cast<unsigned long long>(r.maps), static_cast<unsigned long long>(r.unmaps),
              static_cast<double>(r.peak_reserved) / static_cast<double>(r.peak_live));
  const std::uint64_t cap = t.peak_live + t.peak_live / 20;
  auto capped = manager(64 * gib, cap);
  const outcome c = run_workload(*capped);
  EXPECT_EQ(c.failures, 0u) << "1.05 times the peak of live bytes is room enough";
  EXPECT_LE(c.peak_reserved, cap);
  EXPECT_EQ(c.peak_live, t.peak_live);
}

TEST(MemoryLimit, FarFromTheBudgetABigSliceMapsNothingAheadASmallOneDoes) {
  // A device of 64 GiB: far from its budget, the arena grows in units of 256 MiB (its default
  // `grow`). A slice of at least four units maps its own granules and nothing beyond them: at the
  // end of a growth the memory mapped ahead would stay free.
  auto m = manager(64 * gib, 0);
  auto big = m->reserve(3 * gib + mib);
  ASSERT_TRUE(big) << big.err().message();
  EXPECT_EQ(m->statistics().bytes_reserved, 3 * gib + 2 * mib) << "the big slice's granules, none ahead";
  const std::uint64_t maps_after_big = m->statistics().maps;
  // A smaller slice where the arena grows maps ahead: the next one of its kind needs no map.
  auto small = m->reserve(100 * mib);
  ASSERT_TRUE(small) << small.err().message();
  EXPECT_GT(m->statistics().bytes_reserved, 3 * gib + 2 * mib + 100 * mib) << "mapped ahead";
  const std::uint64_t maps_after_small = m->statistics().maps;
  EXPECT_GT(maps_after_small, maps_after_big);
  auto next = m->reserve(20 * mib);
  ASSERT_TRUE(next) << next.err().message();
  EXPECT_EQ(m->statistics().maps, maps_after_small) << "served by the memory mapped ahead";
  EXPECT_EQ(m->check_invariants(), "");
}

TEST(MemoryLimit, FarFromTheBudgetAMappingAheadFollowsTheRiseOfThePeak) {
  // Far from the budget the arena maps ahead where it grows, at most 128 MiB at once, but no
  // further than the slice raises the peak of live bytes by (64 MiB in any case): a last burst
  // that raises the peak a little leaves little mapped for nothing.
  auto m = manager(64 * gib, 0);
  auto weights = m->reserve(2 * gib);  // four units or more: its own granules, nothing ahead
  ASSERT_TRUE(weights) << weights.err().message();
  ASSERT_EQ(m->statistics().bytes_reserved, 2 * gib);
  auto small_rise = m->reserve(40 * mib);
  ASSERT_TRUE(small_rise) << small_rise.err().message();
  memory_statistics st = m->statistics();
  EXPECT_EQ(st.bytes_in_use, 2 * gib + 40 * mib);
  EXPECT_LE(st.bytes_reserved, st.bytes_in_use + 64 * mib) << "a peak raised by 40 MiB maps 64 MiB ahead at most";
  EXPECT_GE(st.bytes_reserved, st.bytes_in_use + 60 * mib) << "but maps ahead";
  auto large_rise = m->reserve(300 * mib);
  ASSERT_TRUE(large_rise) << large_rise.err().message();
  st = m->statistics();
  EXPECT_EQ(st.bytes_in_use, 2 * gib + 340 * mib);
  EXPECT_GE(st.bytes_reserved, st.bytes_in_use + 120 * mib) << "a peak raised by 300 MiB maps further ahead";
  EXPECT_LE(st.bytes_reserved, st.bytes_in_use + 128 * mib) << "at most 128 MiB ahead";
  EXPECT_EQ(m->check_invariants(), "");
}

namespace {

// Growing caches (a key-value cache per request, reallocated larger at every step): each growth
// reserves the larger size, then drops the old one, and a request ends now and then. Between two
// growths, `quiet` reserve and drop pairs of a small size that never need a map.
struct growth_outcome {
  std::uint64_t unmaps = 0;
  std::uint64_t peak_reserved = 0;
  std::uint64_t peak_live = 0;
  std::uint64_t evicted_below_peak = 0;  // the most an unmap left the memory held below its peak
};

growth_outcome grow_caches(memory_manager& m, int quiet) {
  std::mt19937_64 rng(11);
  const auto log_uniform = [&](double lo, double hi) {
    return static_cast<std::uint64_t>(
        std::exp(std::log(lo) + (std::log(hi) - std::log(lo)) * std::uniform_real_distribution<double>(0, 1)(rng)));
  };
  std::vector<memory_handle> caches(40);
  std::vector<std::uint64_t> sizes(40, 0);
  auto steady = m.reserve(64 * 1024).value();  // keeps the small size's memory mapped
  growth_outcome out;
  for (int step = 0; step < 4000; ++step) {
    const std::size_t c = rng() % caches.size();
    if (!caches[c]) {
      sizes[c] = log_uniform(4096, 4 * mib);
    } else if (rng() % 20 == 0) {
      caches[c] = memory_handle{};
      continue;
    } else {
      sizes[c] += log_uniform(4096, mib);
    }
    const memory_statistics before = m.statistics();
    auto grown = m.reserve(sizes[c]);
    EXPECT_TRUE(grown) << grown.err().message();
    if (!grown) return out;
    const memory_statistics after = m.statistics();
    if (after.unmaps > before.unmaps && before.peak_bytes_reserved > after.bytes_reserved) {
      out.evicted_below_peak = std::max(out.evicted_below_peak, before.peak_bytes_reserved - after.bytes_reserved);
    }
    caches[c] = std::move(*grown);  // the old cache dropped after the new one exists
    for (int i = 0; i < quiet; ++i) EXPECT_TRUE(m.reserve(32 * 1024));
  }
  const memory_statistics st = m.statistics();
  out.unmaps = st.unmaps;
  out.peak_reserved = st.peak_bytes_reserved;
  out.peak_live = st.peak_bytes_in_use;
  return out;
}

}  // namespace

// Far from the budget, free memory is kept within 1.10 times the peak of live bytes, and also
// within the most the arena has held: growing caches fragment past 1.10 times, and a map there
// would otherwise unmap free memory that a later growth maps again. Now a map unmaps only where it
// would raise the peak (the memory held after it stays within a mapping of the peak), and the
// peak is no higher. Before this rule: 373 unmaps, the memory held left 28 MiB below its peak.
TEST(MemoryLimit, FarFromTheBudgetAMapUnmapsOnlyWhereItWouldRaiseThePeakHeld) {
  auto m = manager(64 * gib, 0);
  const growth_outcome o = grow_caches(*m, 40);
  std::printf("%llu unmaps, the memory held at most %.1f MiB below its peak after one, peak reserved %.3f of live\n",
              static_cast<unsigned long long>(o.unmaps), static_cast<double>(o.evicted_below_peak) / mib,
              static_cast<double>(o.peak_reserved) / static_cast<double>(o.peak_live));
  EXPECT_LE(o.unmaps, 200u);
  EXPECT_LE(o.evicted_below_peak, 16 * mib) << "an unmap only where the map would raise the peak";
  EXPECT_LE(static_cast<double>(o.peak_reserved), 1.25 * static_cast<double>(o.peak_live));
  EXPECT_EQ(m->check_invariants(), "");
}

// An explicit cleanup gives the free memory back and forgets the peak held: what it gave back is
// not kept mapped again for the old peak's sake. The arena's report says the peak it keeps to.
TEST(MemoryLimit, AnExplicitCleanupForgetsTheMostTheArenaHeld) {
  auto m = manager(64 * gib, 0);
  const growth_outcome o = grow_caches(*m, 0);
  const std::string held = format_bytes(o.peak_reserved);
  EXPECT_NE(m->report().find("mapped (at most " + held + " since the last cleanup;"), std::string::npos) << m->report();
  ASSERT_TRUE(m->cleanup(true));
  EXPECT_EQ(m->statistics().bytes_reserved, 0u) << "nothing was live";
  EXPECT_NE(m->report().find("mapped (at most 0 B since the last cleanup;"), std::string::npos) << m->report();
  auto again = m->reserve(8 * mib);
  ASSERT_TRUE(again);
  EXPECT_EQ(m->check_invariants(), "");
}

// Near the limit, mappings are small next to it (at most 1/128 of the limit) and a mapping ahead is
// no larger than the slice that grows the arena: a device unmaps whole mappings only, and the free
// part of one that a live slice pins stays mapped. 128 buffers of 4 MiB, every other one freed,
// then 1 GiB, capped at 1.05 times the peak of live bytes (1.25 GiB): with mappings of 8 MiB or
// more ahead of the buffers, each freed buffer's memory stayed mapped beside a live one and the
// 1 GiB reserve failed.
TEST(MemoryLimit, NearTheLimitBuffersOfOneSizeEveryOtherFreedLeaveRoomForABigOne) {
  const std::uint64_t peak_live = gib + 64 * 4 * mib;
  const std::uint64_t cap = peak_live + peak_live / 20;
  auto m = manager(64 * gib, cap);
  std::vector<memory_handle> small;
  for (int i = 0; i < 128; ++i) {
    auto r = m->reserve(4 * mib);
    ASSERT_TRUE(r) << r.err().message();
    small.push_back(std::move(*r));
  }
  for (std::size_t i = 0; i < small.size(); i += 2) small[i].reset();
  auto big = m->reserve(gib);
  ASSERT_TRUE(big) << big.err().message() << "\n" << m->report();
  EXPECT_LE(m->statistics().peak_bytes_reserved, cap);
  EXPECT_EQ(m->statistics().failed_reserves, 0u);
  EXPECT_EQ(m->check_invariants(), "");
}

// The same near the limit where a freed slice's memory is reused in part: 54.7 MiB and 42.7 MiB,
// the first freed, then two more of 42.7 MiB, capped at 1.05 times the three of 42.7 MiB. The
// first slice's mappings (32 MiB each, before) stayed mapped under the slice that reused their
// front, and the last reserve failed.
TEST(MemoryLimit, NearTheLimitAFreedSliceReusedInPartPinsLittleMemory) {
  const std::uint64_t a = 57'313'649;
  const std::uint64_t b = 44'738'004;
  const std::uint64_t cap = 3 * b + 3 * b / 20;
  auto m = manager(64 * gib, cap);
  auto first = m->reserve(a);
  ASSERT_TRUE(first) << first.err().message();
  auto second = m->reserve(b);
  ASSERT_TRUE(second) << second.err().message();
  first->reset();
  auto third = m->reserve(b);
  ASSERT_TRUE(third) << third.err().message();
  auto fourth = m->reserve(b);
  ASSERT_TRUE(fourth) << fourth.err().message() << "\n" << m->report();
  EXPECT_LE(m->statistics().peak_bytes_reserved, cap);
  EXPECT_EQ(m->check_invariants(), "");
}
