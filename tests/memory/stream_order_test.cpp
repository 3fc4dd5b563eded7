// Stream order on a simulated device with queues: memory freed on a stream is reused at once by
// that stream, by other streams only once a fence recorded on it after the free has passed, and
// memory named for several streams only once all of theirs have. The simulated queues pass
// tickets only when a test lets them, queue by queue, so every interleaving here is exact.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <vector>

#include "devrt/devices/sim_storage.hpp"
#include "devrt/memory/memory_manager.hpp"

using namespace devrt;
using namespace devrt::memory;

namespace {

constexpr queue_id stream_a = 0x1000;
constexpr queue_id stream_b = 0x2000;
constexpr queue_id stream_c = 0x3000;
constexpr std::uint64_t mib = 1ULL << 20;

struct fixture {
  devices::sim_storage* sim = nullptr;
  std::unique_ptr<memory_manager> m;

  explicit fixture(memory_layout layout = preset::automatic, std::uint64_t capacity = 0) {
    devices::sim_options o;
    o.queues = true;
    o.props.map_granularity = 2 * mib;
    o.props.capacity = capacity;
    auto store = storage::make<devices::sim_storage>(o);
    sim = store.backend<devices::sim_storage>();
    manager_options opts;
    opts.layout = std::move(layout);
    m = std::make_unique<memory_manager>(std::move(store), opts);
  }
  std::uint64_t offset(const memory_handle& h) { return m->get_storage(h).value().offset; }
  memory_handle reserve(std::uint64_t size, queue_id q) { return m->reserve(size, q).value(); }
  void end_batch() { ASSERT_TRUE(m->end_batch()); }
  /// A batch end that fences every stream freed on (as when memory is wanted).
  void fenced_batch() {
    m->want_fences();
    end_batch();
  }
};

}  // namespace

TEST(StreamOrder, OneStreamReusesAtOnceWithoutFences) {
  fixture f;
  auto h = f.reserve(mib, stream_a);
  const std::uint64_t at = f.offset(h);
  h.reset();
  f.end_batch();
  EXPECT_EQ(f.offset(f.reserve(mib, stream_a)), at);
  EXPECT_EQ(f.m->order().fences(), 0u);  // a single stream needs no fence at all
  EXPECT_FALSE(f.m->order().several());
  EXPECT_EQ(f.m->check_invariants(), "");
}

TEST(StreamOrder, TheSameStreamReusesAtOnceAnotherWaitsForTheFence) {
  fixture f;
  auto keep_b = f.reserve(4096, stream_b);  // two streams in use
  auto h = f.reserve(mib, stream_a);
  const std::uint64_t at = f.offset(h);
  h.reset();
  f.m->process_releases();
  // Stream B must not get A's memory while A's work may still use it.
  auto b1 = f.reserve(mib, stream_b);
  EXPECT_NE(f.offset(b1), at);
  // Stream A may: its own later work runs after the old.
  auto a1 = f.reserve(mib, stream_a);
  EXPECT_EQ(f.offset(a1), at);
  a1.reset();
  b1.reset();
  f.end_batch();  // B needed new memory while A's was tagged: A and B are fenced now
  EXPECT_EQ(f.m->order().fences(), 2u);
  auto b2 = f.reserve(mib, stream_b);
  EXPECT_NE(f.offset(b2), at) << "the fence on A has not passed";
  b2.reset();
  f.sim->progress_queue(stream_a);
  f.end_batch();  // polls: A's fence passed
  auto c = f.reserve(mib, stream_c);
  EXPECT_EQ(f.offset(c), at) << "after A's fence, the memory is free for every stream";
  EXPECT_EQ(f.m->check_invariants(), "");
}

TEST(StreamOrder, AStreamThatReusesItsOwnMemoryCostsNoFence) {
  fixture f;
  auto keep_b = f.reserve(4096, stream_b);
  auto h = f.reserve(mib, stream_a);
  for (int i = 0; i < 40; ++i) {
    h.reset();
    f.end_batch();
    h = f.reserve(mib, stream_a);  // its own tagged memory: no fence needed
  }
  EXPECT_EQ(f.m->order().fences(), 0u);
  for (std::uint32_t i = 0; i < stream_order::fence_after; ++i) {
    h.reset();
    h = f.reserve(mib, stream_a);
  }
  f.end_batch();  // enough frees unfenced: one fence, so other streams may get the memory later
  EXPECT_EQ(f.m->order().fences(), 1u);
  EXPECT_EQ(f.m->check_invariants(), "");
}

TEST(StreamOrder, ASecondStreamIsJoinedBehindTheFirst) {
  fixture f;
  auto h = f.reserve(mib, stream_a);
  const std::uint64_t at = f.offset(h);
  h.reset();  // freed untagged: one stream only
  f.end_batch();
  EXPECT_EQ(f.sim->joins(), 0u);
  auto b = f.reserve(mib, stream_b);
  // B may take the memory at once because it now waits for everything queued on A before it.
  EXPECT_EQ(f.sim->joins(), 1u);
  EXPECT_EQ(f.offset(b), at);
  EXPECT_TRUE(f.m->order().several());
  EXPECT_EQ(f.sim->queues().size(), 2u);
}

TEST(StreamOrder, RecordStreamHoldsTheMemoryUntilEveryStreamsFence) {
  fixture f;
  auto h = f.reserve(mib, stream_a);
  const std::uint64_t at = f.offset(h);
  ASSERT_TRUE(f.m->record_stream(h.binding(), stream_b));
  h.reset();
  f.end_batch();  // held memory is always fenced
  auto a1 = f.reserve(mib, stream_a);
  EXPECT_NE(f.offset(a1), at) << "B may still use it: not even A may take it";
  a1.reset();
  f.sim->progress_queue(stream_a);
  f.end_batch();
  auto a2 = f.reserve(mib, stream_a);
  EXPECT_NE(f.offset(a2), at) << "only A's fence has passed";
  a2.reset();
  f.sim->progress_queue(stream_b);
  f.end_batch();
  auto c = f.reserve(mib, stream_c);
  EXPECT_EQ(f.offset(c), at);
  EXPECT_EQ(f.m->check_invariants(), "");
}

TEST(StreamOrder, HeldMemoryIsNotInUseForTheStatistics) {
  fixture f;
  auto h = f.reserve(mib, stream_a);
  ASSERT_TRUE(f.m->record_stream(h.binding(), stream_b));
  EXPECT_EQ(f.m->statistics().bytes_in_use, mib);
  h.reset();
  f.end_batch();
  EXPECT_EQ(f.m->statistics().bytes_in_use, 0u);
  EXPECT_EQ(f.m->check_invariants(), "");
  f.sim->progress();
  f.end_batch();
  EXPECT_EQ(f.m->statistics().bytes_in_use, 0u);
  EXPECT_EQ(f.m->usage().number_allocs, 0u);
  EXPECT_EQ(f.m->check_invariants(), "");
}

TEST(StreamOrder, ThePerThreadStreamNeverReusesInOrder) {
  fixture f;
  auto h = f.reserve(mib, queue::per_thread);
  const std::uint64_t at = f.offset(h);
  h.reset();
  f.end_batch();
  // Another thread's per-thread stream is another stream: no reuse before the fence.
  auto p = f.reserve(mib, queue::per_thread);
  EXPECT_NE(f.offset(p), at);
  p.reset();
  f.end_batch();
  f.sim->progress();
  f.end_batch();
  EXPECT_EQ(f.offset(f.reserve(mib, queue::per_thread)), at);
}

TEST(StreamOrder, PoolsWithoutTagsHoldFreesOfSeveralStreams) {
  fixture f(preset::sub_slices);
  auto keep = f.reserve(4096, stream_b);
  auto h = f.reserve(64 * 1024, stream_a);
  const auto at = f.m->get_storage(h).value();
  h.reset();
  f.end_batch();
  auto again = f.reserve(64 * 1024, stream_a);
  EXPECT_FALSE(f.m->get_storage(again).value() == at);
  again.reset();
  f.sim->progress();
  f.end_batch();
  auto later = f.reserve(64 * 1024, stream_b);
  EXPECT_EQ(f.m->get_storage(later).value().offset, at.offset);
  EXPECT_EQ(f.m->get_storage(later).value().id, at.id);
  EXPECT_EQ(f.m->check_invariants(), "");
}

TEST(StreamOrder, MemoryPressureWaitsForTheFencesOnceAndCountsIt) {
  fixture f(preset::automatic, 8 * mib);
  auto keep = f.reserve(4096, stream_b);
  auto h = f.reserve(6 * mib, stream_a);
  h.reset();
  f.end_batch();
  // B needs 6 MiB: only A's freed memory can give it, and A's fence has not passed.
  auto b = f.m->reserve(6 * mib, stream_b);
  ASSERT_TRUE(b) << b.err().message();
  EXPECT_EQ(f.sim->waits(), 1u);
  EXPECT_EQ(f.m->statistics().stream_waits, 1u);
  EXPECT_EQ(f.m->check_invariants(), "");
}

TEST(StreamOrder, ANewMappingHarvestsPassedFencesFirst) {
  fixture f;
  auto keep = f.reserve(4096, stream_b);
  auto h = f.reserve(8 * mib, stream_a);
  h.reset();
  f.fenced_batch();
  f.sim->progress_queue(stream_a);  // passed, but nobody has looked yet
  const auto maps = f.m->statistics().maps;
  auto b = f.reserve(8 * mib, stream_b);
  EXPECT_EQ(f.m->statistics().maps, maps) << "the passed fence made A's memory free for B: no new mapping";
  EXPECT_EQ(f.m->check_invariants(), "");
}

TEST(StreamOrder, RetiredStreamsGetNoFences) {
  fixture f;
  auto keep = f.reserve(4096, stream_b);
  auto h = f.reserve(mib, stream_a);
  h.reset();
  ASSERT_TRUE(f.m->retire_stream(stream_a));  // fences A's frees now
  const auto issued = f.sim->issued_tickets();
  EXPECT_EQ(f.m->order().stream_count(), 1u);
  f.end_batch();
  EXPECT_EQ(f.sim->issued_tickets(), issued);
  EXPECT_EQ(f.sim->queues().size(), 1u);
}

TEST(StreamOrder, ExplicitCleanupWaitsAndReturnsEverything) {
  fixture f;
  auto keep = f.reserve(4096, stream_b);
  auto h = f.reserve(8 * mib, stream_a);
  h.reset();
  keep.reset();
  f.end_batch();
  ASSERT_TRUE(f.m->cleanup(true));
  EXPECT_EQ(f.m->statistics().bytes_reserved, 0u);
  EXPECT_EQ(f.m->check_invariants(), "");
}

// A model of the contract: every allocation handed to stream S never overlaps memory freed on
// another stream T (or named for T by record_stream) unless a fence recorded on T after that free
// has passed. Random streams, sizes, frees, record_stream and progress of single queues.
TEST(StreamOrder, RandomizedNeverHandsOutMemoryAStreamMayStillUse) {
  for (const char* layout : {"auto", "sub-slices"}) {
    fixture f(parse_layout(layout).value());
    std::mt19937_64 rng(1234);
    const queue_id streams[] = {stream_a, stream_b, stream_c, queue::device};
    struct live {
      memory_handle h;
      queue_id q;
      std::vector<queue_id> more;
    };
    struct freed {
      storage_handle at;
      std::vector<queue_id> users;
      ticket issued_at;
    };
    std::vector<live> lives;
    std::vector<freed> frees;
    // Every stream in use from the start (the move from one stream to several joins the new one
    // behind the old, which this model does not follow).
    std::vector<memory_handle> anchors;
    for (const queue_id q : streams) anchors.push_back(f.reserve(512, q));
    auto overlaps = [](const storage_handle& a, std::uint64_t extent_a, const storage_handle& b,
                       std::uint64_t extent_b) {
      return a.id == b.id && a.offset < b.offset + extent_b && b.offset < a.offset + extent_a;
    };
    for (int step = 0; step < 20000; ++step) {
      const int op = static_cast<int>(rng() % 100);
      if (op < 45 || lives.empty()) {
        const queue_id q = streams[rng() % 4];
        const std::uint64_t size = 512 * (1 + rng() % 4096);
        auto r = f.m->reserve(size, q);
        ASSERT_TRUE(r) << r.err().message();
        const storage_handle at = f.m->get_storage(*r).value();
        for (const auto& fr : frees) {
          if (!overlaps(at, std::max<std::uint64_t>(at.size, 1), fr.at, std::max<std::uint64_t>(fr.at.size, 1)))
            continue;
          for (const queue_id u : fr.users) {
            if (u == q && fr.users.size() == 1) continue;  // its own stream: in order
            ASSERT_GT(f.sim->passed_on(u), fr.issued_at)
                << layout << " step " << step << ": stream " << q << " got memory freed on " << u
                << " before a fence behind the free passed";
          }
        }
        lives.push_back(live{std::move(*r), q, {}});
      } else if (op < 85) {
        const std::size_t i = rng() % lives.size();
        freed fr{f.m->get_storage(lives[i].h).value(), {lives[i].q}, f.sim->issued_tickets()};
        for (const queue_id u : lives[i].more) fr.users.push_back(u);
        frees.push_back(fr);
        lives[i] = std::move(lives.back());
        lives.pop_back();
      } else if (op < 90) {
        const std::size_t i = rng() % lives.size();
        const queue_id u = streams[rng() % 4];
        ASSERT_TRUE(f.m->record_stream(lives[i].h.binding(), u));
        if (u != lives[i].q) lives[i].more.push_back(u);
      } else if (op < 95) {
        f.end_batch();
      } else if (op < 97) {
        f.fenced_batch();
      } else {
        f.sim->progress_queue(streams[rng() % 4]);
      }
      if (frees.size() > 256) frees.erase(frees.begin(), frees.begin() + 128);
      if (step % 1000 == 0) {
        ASSERT_EQ(f.m->check_invariants(), "") << layout << " step " << step;
      }
    }
    lives.clear();
    anchors.clear();
    f.fenced_batch();  // fences the last frees
    f.sim->progress();
    f.end_batch();
    EXPECT_EQ(f.m->check_invariants(), "");
    EXPECT_EQ(f.m->usage().number_allocs, 0u) << layout;
  }
}
