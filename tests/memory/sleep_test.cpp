// Tags, sleep and wake on the host device (its arena) and on the simulated one: a sleeping tag
// gives its memory back, a wake restores it at the same addresses with its bytes, a discard wakes
// to usable memory, a wake without room fails and changes nothing, frees are allowed while asleep,
// reserves with a sleeping tag fail, and every pool stays consistent throughout.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "devrt/devices/host_storage.hpp"
#include "devrt/devices/sim_storage.hpp"
#include "devrt/memory/memory_manager.hpp"
#include "devrt/memory/tag.hpp"

using namespace devrt;
using namespace devrt::memory;

namespace {

constexpr std::uint64_t mib = 1ULL << 20;

std::unique_ptr<memory_manager> host_manager(std::uint64_t capacity = 0) {
  devices::host_options o;
  o.capacity = capacity;
  manager_options opts;
  opts.name = "host";
  opts.reclaim_on_out_of_memory = true;
  return std::make_unique<memory_manager>(storage::make<devices::host_storage>(o), opts);
}

tag_id tag(const char* name) { return intern_tag(tag_name(name)).value(); }

void fill(void* p, std::uint64_t n, unsigned seed) {
  std::mt19937 g(seed);
  auto* b = static_cast<unsigned char*>(p);
  for (std::uint64_t i = 0; i < n; ++i) b[i] = static_cast<unsigned char>(g());
}

bool same(const void* p, std::uint64_t n, unsigned seed) {
  std::vector<unsigned char> want(n);
  fill(want.data(), n, seed);
  return std::memcmp(p, want.data(), n) == 0;
}

// Sleep (or wake) and settle, as the runtime does once the device has passed the event.
void sleep_now(memory_manager& m, tag_id t, bool keep) {
  ASSERT_TRUE(m.sleep(t, keep)) << "sleep failed";
  ASSERT_TRUE(m.settle_tag(t));
}

const tag_usage* usage_of(const std::vector<tag_usage>& all, const char* name) {
  for (const auto& u : all) {
    if (u.name == name) return &u;
  }
  return nullptr;
}

}  // namespace

TEST(TagName, RejectsLongAndUnprintableTags) {
  EXPECT_TRUE(tag_name::make(std::string(63, 'a')));
  auto too_long = tag_name::make(std::string(64, 'a'));
  ASSERT_FALSE(too_long);
  EXPECT_EQ(too_long.code(), errc::invalid_argument);
  EXPECT_NE(too_long.err().message().find("63"), std::string::npos) << too_long.err().message();
  EXPECT_FALSE(tag_name::make("bad\ttag"));
  EXPECT_FALSE(tag_name::make("caf\xc3\xa9"));
  EXPECT_THROW(tag_name("x\n"), devrt::exception);
  EXPECT_EQ(intern_tag(tag_name("weights")).value(), intern_tag(tag_name("weights")).value());
  EXPECT_NE(intern_tag(tag_name("weights")).value(), intern_tag(tag_name("kv_cache")).value());
  EXPECT_EQ(intern_tag(tag_name()).value(), 0);
  EXPECT_EQ(tag_of(tag("weights")).view(), "weights");
}

TEST(Sleep, GivesTheMemoryBackAndWakesAtTheSameAddressesWithTheBytes) {
  auto m = host_manager();
  const tag_id w = tag("sleep.weights");
  std::vector<memory_handle> hs;
  std::vector<std::uint64_t> sizes = {3 * mib + 17, 64, 10 * mib, 1, 2 * mib};
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    hs.push_back(m->reserve(sizes[i], streams::device, w).value());
    fill(hs.back().ptr(), sizes[i], static_cast<unsigned>(i));
  }
  auto other = m->reserve(5 * mib).value();  // untagged: stays mapped
  fill(other.ptr(), 5 * mib, 99);
  std::vector<void*> ptrs;
  for (auto& h : hs) ptrs.push_back(h.ptr());
  const std::uint64_t tagged = 3 * mib + 17 + 64 + 10 * mib + 1 + 2 * mib;
  const std::uint64_t before = m->statistics().bytes_reserved;

  sleep_now(*m, w, true);
  ASSERT_EQ(m->check_invariants(), "");
  const memory_statistics& st = m->statistics();
  EXPECT_GE(before - st.bytes_reserved, tagged) << "the device's held bytes drop by at least the tag's size";
  EXPECT_GE(st.bytes_sleeping, tagged);
  EXPECT_GE(st.bytes_offloaded, tagged);
  EXPECT_EQ(st.sleeps, 1u);
  const auto tags = m->tags();
  const tag_usage* u = usage_of(tags, "sleep.weights");
  ASSERT_NE(u, nullptr);
  EXPECT_EQ(u->state, tag_state::asleep);
  EXPECT_TRUE(u->contents_kept);
  EXPECT_EQ(u->bytes_reserved, 0u);
  EXPECT_EQ(u->allocations, sizes.size());
  EXPECT_TRUE(same(other.ptr(), 5 * mib, 99)) << "other memory is untouched";
  EXPECT_NE(m->report().find("tag 'sleep.weights': asleep (contents kept)"), std::string::npos) << m->report();

  auto refused = m->reserve(100, streams::device, w);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.code(), errc::asleep);
  EXPECT_NE(refused.err().message().find("sleep.weights"), std::string::npos) << refused.err().message();

  ASSERT_TRUE(m->wake(w));
  ASSERT_TRUE(m->settle_tag(w));
  ASSERT_EQ(m->check_invariants(), "");
  for (std::size_t i = 0; i < hs.size(); ++i) {
    EXPECT_EQ(hs[i].ptr(), ptrs[i]);
    EXPECT_TRUE(same(hs[i].ptr(), sizes[i], static_cast<unsigned>(i))) << "allocation " << i << " restored";
  }
  EXPECT_EQ(m->statistics().bytes_sleeping, 0u);
  EXPECT_EQ(m->statistics().bytes_offloaded, 0u) << "the host copy is freed once restored";
  EXPECT_EQ(m->statistics().wakes, 1u);
  EXPECT_TRUE(m->reserve(100, streams::device, w)) << "awake again: reserves are served";
}

// A failed reserve with a tag changes nothing: the tag still counts as never used here, so a sleep
// does nothing and later reserves with it are served.
TEST(Sleep, ATagOnlyAFailedReserveNamedIsNeverUsedAndDoesNotSleep) {
  auto m = host_manager();
  const tag_id t = tag("sleep.failed-first");
  auto huge = m->reserve(std::uint64_t{1} << 61, streams::device, t);
  ASSERT_FALSE(huge);
  auto slept = m->sleep(t, true);
  ASSERT_TRUE(slept) << slept.err().message();
  EXPECT_EQ(m->statistics().sleeps, 0u);
  auto served = m->reserve(4096, streams::device, t);
  ASSERT_TRUE(served) << served.err().message();
  // Used now: a sleep puts it to sleep, and reserves wait for the wake.
  served->reset();
  ASSERT_TRUE(m->sleep(t, true));
  EXPECT_EQ(m->statistics().sleeps, 1u);
  EXPECT_EQ(m->reserve(4096, streams::device, t).code(), errc::asleep);
  ASSERT_TRUE(m->wake(t));
  EXPECT_TRUE(m->reserve(4096, streams::device, t));
  EXPECT_EQ(m->check_invariants(), "");
}

TEST(Sleep, DiscardWakesToUsableMemory) {
  auto m = host_manager();
  const tag_id kv = tag("sleep.kv");
  auto h = m->reserve(4 * mib, streams::device, kv).value();
  void* p = h.ptr();
  sleep_now(*m, kv, false);
  EXPECT_EQ(m->statistics().bytes_offloaded, 0u);
  ASSERT_TRUE(m->wake(kv));
  ASSERT_TRUE(m->settle_tag(kv));
  EXPECT_EQ(h.ptr(), p);
  fill(h.ptr(), 4 * mib, 5);
  EXPECT_TRUE(same(h.ptr(), 4 * mib, 5));
  EXPECT_EQ(m->check_invariants(), "");
}

TEST(Sleep, WakeWithoutRoomFailsAndChangesNothing) {
  auto m = host_manager(64 * mib);
  const tag_id a = tag("sleep.model_a");
  auto ha = m->reserve(40 * mib, streams::device, a).value();
  fill(ha.ptr(), 40 * mib, 1);
  sleep_now(*m, a, true);
  auto hb = m->reserve(40 * mib).value();  // the room A left
  auto w = m->wake(a);
  ASSERT_FALSE(w);
  EXPECT_EQ(w.code(), errc::out_of_memory);
  EXPECT_NE(w.err().message().find("wake of tag 'sleep.model_a', to map again:"), std::string::npos)
      << "explained as a reserve's: " << w.err().message();
  ASSERT_EQ(m->check_invariants(), "");
  const auto tags = m->tags();
  const tag_usage* u = usage_of(tags, "sleep.model_a");
  ASSERT_NE(u, nullptr);
  EXPECT_EQ(u->state, tag_state::asleep);
  EXPECT_GE(u->bytes_offloaded, 40 * mib) << "the kept copy is not lost";
  hb.reset();
  ASSERT_TRUE(m->wake(a)) << "room again";
  ASSERT_TRUE(m->settle_tag(a));
  EXPECT_TRUE(same(ha.ptr(), 40 * mib, 1));
  EXPECT_EQ(m->check_invariants(), "");
}

TEST(Sleep, FreesWhileAsleepAreAllowedAndForgotten) {
  auto m = host_manager();
  const tag_id t = tag("sleep.freed");
  auto keep = m->reserve(3 * mib, streams::device, t).value();
  auto drop = m->reserve(6 * mib, streams::device, t).value();
  fill(keep.ptr(), 3 * mib, 7);
  sleep_now(*m, t, true);
  drop.reset();
  m->process_releases();
  ASSERT_EQ(m->check_invariants(), "");
  ASSERT_TRUE(m->wake(t));
  ASSERT_TRUE(m->settle_tag(t));
  EXPECT_TRUE(same(keep.ptr(), 3 * mib, 7));
  const auto tags = m->tags();
  EXPECT_EQ(usage_of(tags, "sleep.freed")->allocations, 1u);
  EXPECT_LT(usage_of(tags, "sleep.freed")->bytes_reserved, 9 * mib)
      << "the freed allocation's memory is not mapped back";
  keep.reset();
  m->process_releases();
  EXPECT_EQ(m->check_invariants(), "");
  // Everything freed while asleep: the wake maps nothing.
  auto last = m->reserve(2 * mib, streams::device, t).value();
  sleep_now(*m, t, false);
  last.reset();
  const std::uint64_t maps = m->statistics().maps;
  ASSERT_TRUE(m->wake(t));
  EXPECT_EQ(m->statistics().maps, maps);
  EXPECT_EQ(m->check_invariants(), "");
}

TEST(Sleep, UnknownOrRepeatedSleepAndWakeChangeNothing) {
  auto m = host_manager();
  const tag_id t = tag("sleep.twice");
  EXPECT_EQ(m->sleep(tag("sleep.never_used"), true).value(), event{0});
  EXPECT_EQ(m->wake(t).value(), event{0});
  auto h = m->reserve(mib, streams::device, t).value();
  sleep_now(*m, t, true);
  const std::uint64_t sleeps = m->statistics().sleeps;
  sleep_now(*m, t, false);  // asleep already: the kept copy stays
  EXPECT_EQ(m->statistics().sleeps, sleeps);
  EXPECT_GE(m->statistics().bytes_offloaded, mib);
  ASSERT_TRUE(m->wake(t));
  ASSERT_TRUE(m->settle_tag(t));
  ASSERT_TRUE(m->wake(t));
  EXPECT_EQ(m->statistics().wakes, 1u);
}

TEST(Sleep, CaptureWindowRefusesAndTaggedMemoryOfTheWindowIsPersistent) {
  auto m = host_manager();
  const tag_id t = tag("sleep.capture");
  m->capture_begin();
  auto h = m->reserve(mib, streams::device, t).value();
  EXPECT_EQ(h.raw()->loc.pool, location::persistent_pool);
  auto s = m->sleep(t, true);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.code(), errc::capture_active);
  ASSERT_TRUE(m->capture_end());
}

TEST(Sleep, IsUnsupportedWhereTheDeviceCannotMapMemory) {
  devices::sim_options o;
  o.props.map_granularity = 0;
  manager_options opts;
  opts.layout = preset::sub_slices;
  memory_manager m(storage::make<devices::sim_storage>(o), opts);
  const tag_id t = tag("sleep.label_only");
  auto h = m.reserve(mib, streams::device, t).value();
  const auto tags = m.tags();
  ASSERT_NE(usage_of(tags, "sleep.label_only"), nullptr);
  EXPECT_EQ(usage_of(tags, "sleep.label_only")->bytes_in_use, mib) << "a tag labels memory everywhere";
  auto s = m.sleep(t, true);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.code(), errc::unsupported);
  h.reset();
  m.process_releases();
  EXPECT_EQ(m.tags().front().bytes_in_use, 0u);
}

TEST(Sleep, OrderedWithStreamFreesOnASimulatedDeviceWithQueues) {
  devices::sim_options o;
  o.props.map_granularity = 2 * mib;
  o.streams = true;
  manager_options opts;
  memory_manager m(storage::make<devices::sim_storage>(o), opts);
  const tag_id t = tag("sleep.streams");
  const stream_id a = 0x1000;
  auto live = m.reserve(4 * mib, a, t);
  if (!live) GTEST_SKIP() << "the simulated device does not know stream 0x1000: " << live.err().message();
  auto freed = m.reserve(4 * mib, a, t).value();
  freed.reset();
  m.process_releases();
  auto e = m.sleep(t, false);
  ASSERT_TRUE(e) << e.err().message();
  ASSERT_EQ(m.check_invariants(), "");
  EXPECT_EQ(m.tags().front().bytes_reserved, 0u) << "every mapping of the tag is unmapped, behind the streams' work";
  ASSERT_TRUE(m.wake(t));
  ASSERT_TRUE(m.settle_tag(t));
  EXPECT_EQ(m.check_invariants(), "");
}

TEST(Sleep, KeepsThePinnedCopyForTheNextSleepUntilReleased) {
  auto m = host_manager();
  const tag_id w = tag("sleep.cache");
  auto a = m->reserve(6 * mib + 5, streams::device, w).value();
  auto b = m->reserve(mib, streams::device, w).value();
  fill(a.ptr(), 6 * mib + 5, 1);
  fill(b.ptr(), mib, 2);

  sleep_now(*m, w, true);
  const std::uint64_t copy = m->statistics().bytes_offloaded;
  EXPECT_GE(copy, 7 * mib + 5);
  EXPECT_EQ(m->statistics().bytes_host_cached, 0u) << "the copy holds contents: it is not cached";
  // While asleep the report counts the tag's live bytes apart: in use never exceeds reserved.
  const std::string asleep_report = m->report();
  EXPECT_NE(asleep_report.find("in use by sleeping tags, not on the device"), std::string::npos) << asleep_report;
  const memory_usage u = m->usage();
  EXPECT_GT(u.bytes_in_use, u.bytes_reserved) << "the pools still count the sleeping allocations as live";

  ASSERT_TRUE(m->wake(w));
  ASSERT_TRUE(m->settle_tag(w));
  EXPECT_EQ(m->statistics().bytes_offloaded, 0u);
  EXPECT_EQ(m->statistics().bytes_host_cached, copy) << "the restored copy's memory is kept for the next sleep";
  EXPECT_NE(m->report().find("pinned host memory kept for later copies"), std::string::npos) << m->report();
  ASSERT_EQ(m->check_invariants(), "");

  // The next sleep takes the cached block: nothing cached while it holds the contents.
  fill(a.ptr(), 6 * mib + 5, 3);
  sleep_now(*m, w, true);
  EXPECT_EQ(m->statistics().bytes_host_cached, 0u) << "the second sleep reuses the cached copy";
  EXPECT_EQ(m->statistics().bytes_offloaded, copy);
  EXPECT_EQ(m->release_host_copies(), 0u) << "a copy holding a sleeping tag's contents is not released";
  ASSERT_TRUE(m->wake(w));
  ASSERT_TRUE(m->settle_tag(w));
  EXPECT_TRUE(same(a.ptr(), 6 * mib + 5, 3)) << "the reused copy holds the second sleep's bytes";
  EXPECT_TRUE(same(b.ptr(), mib, 2));

  // A much smaller tag does not take a block more than twice its size: it gets its own.
  const tag_id small = tag("sleep.cache.small");
  auto s = m->reserve(4096, streams::device, small).value();
  fill(s.ptr(), 4096, 4);
  sleep_now(*m, small, true);
  EXPECT_EQ(m->statistics().bytes_host_cached, copy) << "the large block stays cached";
  ASSERT_TRUE(m->wake(small));
  ASSERT_TRUE(m->settle_tag(small));
  EXPECT_TRUE(same(s.ptr(), 4096, 4));
  const std::uint64_t cached = m->statistics().bytes_host_cached;
  EXPECT_GT(cached, copy);

  EXPECT_EQ(m->release_host_copies(), cached);
  EXPECT_EQ(m->statistics().bytes_host_cached, 0u);
  EXPECT_EQ(m->release_host_copies(), 0u);
  ASSERT_EQ(m->check_invariants(), "");
}
