// Stream order on a simulated device with streams: memory freed on a stream is reused at once by
// that stream, by other streams only once a fence behind the free has passed, and memory named
// for several streams only once all of theirs have. Streams are identified by the device, so a
// handle that comes back for a new stream is a new stream. The simulated streams pass events only
// when a test lets them, stream by stream, so every interleaving here is exact.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "devrt/devices/sim_storage.hpp"
#include "devrt/memory/memory_manager.hpp"

using namespace devrt;
using namespace devrt::memory;

namespace {

constexpr stream_id stream_a = 0x1000;
constexpr stream_id stream_b = 0x2000;
constexpr stream_id stream_c = 0x3000;
constexpr std::uint64_t mib = 1ULL << 20;

struct fixture {
  devices::sim_storage* sim = nullptr;
  std::unique_ptr<memory_manager> m;

  explicit fixture(memory_layout layout = preset::automatic, std::uint64_t capacity = 0, bool deferred = false) {
    devices::sim_options o;
    o.streams = true;
    o.deferred_unmaps = deferred;
    o.props.map_granularity = 2 * mib;
    o.props.capacity = capacity;
    auto store = storage::make<devices::sim_storage>(o);
    sim = store.backend<devices::sim_storage>();
    manager_options opts;
    opts.layout = std::move(layout);
    m = std::make_unique<memory_manager>(std::move(store), opts);
  }
  storage_handle at(const memory_handle& h) { return m->get_storage(h).value(); }
  std::uint64_t offset(const memory_handle& h) { return at(h).offset; }
  memory_handle reserve(std::uint64_t size, stream_id q) { return m->reserve(size, q).value(); }
  void end_batch() { ASSERT_TRUE(m->end_batch()); }
  /// A batch end that fences every stream freed on (as when memory is wanted).
  void fenced_batch() {
    m->want_fences();
    end_batch();
  }
};

bool overlap(const storage_handle& a, const storage_handle& b) {
  return a.id == b.id && a.offset < b.offset + std::max<std::uint64_t>(b.size, 1) &&
         b.offset < a.offset + std::max<std::uint64_t>(a.size, 1);
}

}  // namespace

TEST(StreamOrder, OneStreamReusesAtOnceWithoutFences) {
  fixture f;
  auto h = f.reserve(mib, streams::device);
  const std::uint64_t at = f.offset(h);
  h.reset();
  f.end_batch();
  EXPECT_EQ(f.offset(f.reserve(mib, streams::device)), at);
  EXPECT_EQ(f.m->order().fences(), 0u);  // the device's own stream alone needs no fence at all
  EXPECT_EQ(f.sim->free_records(), 0u);
  EXPECT_FALSE(f.m->order().tagged());
  EXPECT_EQ(f.m->check_invariants(), "");
}

// A client's stream may be destroyed right after a free: the free itself records how far the
// stream had come, on the thread that frees, and only that event makes the memory free for others.
TEST(StreamOrder, ANativeStreamIsFencedAtTheFreeByTheThreadThatFrees) {
  fixture f;
  auto h = f.reserve(mib, stream_a);
  EXPECT_TRUE(f.m->order().tagged()) << "a native stream's frees carry their stream even when it is alone";
  const std::uint64_t at = f.offset(h);
  h.reset();
  EXPECT_EQ(f.sim->free_records(), 1u) << "the drop records the stream's point";
  f.m->process_releases();
  EXPECT_EQ(f.offset(f.reserve(mib, stream_a)), at) << "its own stream takes it back at once";
  auto b = f.reserve(mib, stream_b);
  EXPECT_NE(f.offset(b), at);
  f.fenced_batch();
  f.sim->progress_stream(stream_a);
  f.end_batch();
  auto c = f.reserve(mib, stream_c);
  EXPECT_EQ(f.offset(c), at) << "after A's free-time fence passed, any stream may have it";
  EXPECT_EQ(f.sim->waits(), 0u);
  EXPECT_EQ(f.m->check_invariants(), "");
}

TEST(StreamOrder, TheSameStreamReusesAtOnceAnotherWaitsForTheFence) {
  fixture f;
  auto keep_b = f.reserve(4096, stream_b);
  auto h = f.reserve(mib, stream_a);
  const std::uint64_t at = f.offset(h);
  h.reset();
  f.m->process_releases();
  auto b1 = f.reserve(mib, stream_b);
  EXPECT_NE(f.offset(b1), at) << "stream B must not get A's memory while A's work may still use it";
  auto a1 = f.reserve(mib, stream_a);
  EXPECT_EQ(f.offset(a1), at) << "stream A may: its own later work runs after the old";
  a1.reset();
  b1.reset();
  // B needed new memory while A's was tagged: A was fenced then (the first fence), and memory
  // being wanted, the batch's end fences A and B again for the frees since.
  f.end_batch();
  EXPECT_EQ(f.m->order().fences(), 3u);
  auto b2 = f.reserve(mib, stream_b);
  EXPECT_NE(f.offset(b2), at) << "the fence on A has not passed";
  b2.reset();
  f.sim->progress_stream(stream_a);
  f.end_batch();
  auto c = f.reserve(mib, stream_c);
  EXPECT_EQ(f.offset(c), at) << "after A's fence, the memory is free for every stream";
  EXPECT_EQ(f.m->check_invariants(), "");
}

// A client thread serving its own request ends the batch in place: it asks the device how far
// the fences got only every poll_in_place_every such batches (each query is a driver call), and at
// once while memory is held. Until it asks, what passed stays unavailable to other streams: later,
// never earlier.
TEST(StreamOrder, BatchesEndedInPlaceQueryTheFencesOnlyEverySixteenth) {
  using batch_end = memory_manager::batch_end;
  fixture f;
  auto keep_b = f.reserve(4096, stream_b);
  auto h = f.reserve(mib, stream_a);
  const std::uint64_t at = f.offset(h);
  h.reset();
  f.m->want_fences();
  ASSERT_TRUE(f.m->end_batch(batch_end::device_thread));  // A's free gets its fence; nothing passed
  f.sim->progress_stream(stream_a);                       // now it has
  const std::uint64_t queries = f.sim->queries();
  for (std::uint32_t i = 1; i < memory_manager::poll_in_place_every; ++i) {
    ASSERT_TRUE(f.m->end_batch(batch_end::in_place));
  }
  EXPECT_EQ(f.sim->queries(), queries) << "a batch ended in place asked before its turn";
  ASSERT_TRUE(f.m->end_batch(batch_end::in_place));
  EXPECT_EQ(f.sim->queries(), queries + 1) << "the 16th batch ended in place did not ask";
  auto c = f.reserve(mib, stream_c);
  EXPECT_EQ(f.offset(c), at) << "the fence seen passed, A's memory is free for every stream";
  EXPECT_EQ(f.sim->queries(), queries + 1) << "the reserve had to ask again: the batch's answer was not used";
  c.reset();

  // Memory held for several streams: asked at once, at the first batch ended in place.
  auto g = f.reserve(mib, stream_a);
  ASSERT_TRUE(f.m->record_stream(g.binding(), stream_b));
  g.reset();
  f.m->process_releases();
  ASSERT_TRUE(f.m->order().holding());
  const std::uint64_t before = f.sim->queries();
  ASSERT_TRUE(f.m->end_batch(batch_end::in_place));
  EXPECT_GT(f.sim->queries(), before) << "held memory waited for the caller's turn to ask";
  EXPECT_EQ(f.m->check_invariants(), "");
}

// Cross-stream reuse before mapping: a reserve that would map new memory first fences the streams
// with unfenced frees and queries the fences in flight (it never waits), so memory another stream
// freed comes to it as soon as that stream's work has passed, with no batch end in between; memory
// still busy never does.
TEST(StreamOrder, AReserveThatWouldMapTakesMemoryOtherStreamsFreedOnceTheirWorkPassed) {
  fixture f;
  auto keep_b = f.reserve(4096, stream_b);
  auto keep_c = f.reserve(4096, stream_c);
  auto h = f.reserve(4 * mib, stream_a);
  const storage_handle at = f.at(h);
  const event use = f.sim->record_event(stream_a).value();  // a kernel on A uses h
  h.reset();
  f.m->process_releases();
  const std::uint64_t maps = f.m->statistics().maps;
  const std::uint64_t reserved = f.m->statistics().bytes_reserved;

  auto b = f.reserve(4 * mib, stream_b);  // A's work is still queued: B maps new memory
  EXPECT_FALSE(overlap(f.at(b), at) && !f.sim->has_passed(use)) << "B got memory A's queued work still uses";
  EXPECT_GT(f.m->statistics().maps, maps);
  EXPECT_EQ(f.sim->waits(), 0u) << "nothing waited for the device";

  f.sim->progress_stream(stream_a);  // A's work is done; no batch end follows
  const std::uint64_t maps_before_c = f.m->statistics().maps;
  auto c = f.reserve(4 * mib, stream_c);
  EXPECT_TRUE(overlap(f.at(c), at)) << "C takes the memory A freed once A's work passed";
  EXPECT_EQ(f.m->statistics().maps, maps_before_c) << "and maps nothing";
  EXPECT_EQ(f.sim->waits(), 0u);
  EXPECT_GE(f.m->statistics().bytes_reserved, reserved);
  EXPECT_EQ(f.m->check_invariants(), "");
}

// The same for memory held after record_stream: its other stream's fence is queried at the miss.
TEST(StreamOrder, MemoryHeldForARecordedStreamServesAnyStreamOnceThatStreamPassed) {
  fixture f;
  auto keep_b = f.reserve(4096, stream_b);
  auto keep_c = f.reserve(4096, stream_c);
  auto h = f.reserve(4 * mib, stream_a);
  const storage_handle at = f.at(h);
  ASSERT_TRUE(f.m->record_stream(h.binding(), stream_b));
  const event use = f.sim->record_event(stream_b).value();  // a kernel on B uses h
  h.reset();
  f.m->process_releases();
  auto a = f.reserve(4 * mib, stream_a);
  EXPECT_FALSE(overlap(f.at(a), at) && !f.sim->has_passed(use)) << "A got memory B's queued work still uses";
  f.sim->progress();
  const std::uint64_t maps = f.m->statistics().maps;
  auto c = f.reserve(4 * mib, stream_c);
  EXPECT_TRUE(overlap(f.at(c), at)) << "C takes the memory once A's and B's work passed";
  EXPECT_EQ(f.m->statistics().maps, maps);
  EXPECT_EQ(f.sim->waits(), 0u);
  EXPECT_EQ(f.m->check_invariants(), "");
}

TEST(StreamOrder, AStreamThatReusesItsOwnMemoryTakesOneFenceAfterManyFrees) {
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
  EXPECT_EQ(f.sim->free_records(), 40u + stream_order::fence_after) << "one record per free, no event each";
  EXPECT_EQ(f.m->check_invariants(), "");
}

// While the device's memory was used by its own stream alone, frees were immediate. The first
// other stream waits for a fence on it; so does every stream registered until that fence passes.
TEST(StreamOrder, StreamsThatComeAfterTheFirstWaitBehindItUntilItsFencePasses) {
  fixture f;
  auto h = f.reserve(mib, streams::device);
  const storage_handle x = f.at(h);
  h.reset();  // freed untagged: one stream only
  f.end_batch();
  EXPECT_EQ(f.sim->joins(), 0u);
  const event before = f.sim->record_event(streams::device).value();  // work of the device's own still queued
  auto b = f.reserve(mib, stream_b);
  EXPECT_EQ(f.sim->joins(), 1u);
  EXPECT_TRUE(f.sim->ordered_after(f.sim->stream_uid(stream_b), before))
      << "B may take memory freed before only because its work now waits for the device's stream";
  EXPECT_TRUE(overlap(f.at(b), x));
  EXPECT_TRUE(f.m->order().tagged());
  auto c = f.reserve(mib, stream_c);  // the fence has not passed: C waits too
  EXPECT_EQ(f.sim->joins(), 2u);
  f.sim->progress();
  f.end_batch();  // the fence passed
  auto d = f.reserve(mib, 0x4000);
  EXPECT_EQ(f.sim->joins(), 2u) << "no stream waits for anything once the fence has passed";
  EXPECT_EQ(f.m->check_invariants(), "");
}

TEST(StreamOrder, RecordStreamHoldsTheMemoryUntilEveryStreamsFence) {
  fixture f;
  auto h = f.reserve(mib, stream_a);
  const std::uint64_t at = f.offset(h);
  ASSERT_TRUE(f.m->record_stream(h.binding(), stream_b));
  h.reset();
  EXPECT_EQ(f.sim->free_records(), 2u) << "both streams are recorded at the free";
  f.end_batch();  // held memory is always fenced
  auto a1 = f.reserve(mib, stream_a);
  EXPECT_NE(f.offset(a1), at) << "B may still use it: not even A may take it";
  a1.reset();
  f.sim->progress_stream(stream_a);
  f.end_batch();
  auto a2 = f.reserve(mib, stream_a);
  EXPECT_NE(f.offset(a2), at) << "A's fence passed, B's has not";
  a2.reset();
  f.fenced_batch();
  f.sim->progress_stream(stream_b);
  f.sim->progress_stream(stream_a);
  f.end_batch();
  auto c = f.reserve(mib, stream_c);
  EXPECT_EQ(f.offset(c), at) << "both fences passed: the memory is free for every stream";
  EXPECT_EQ(f.m->check_invariants(), "");
}

// The driver gives a destroyed stream's handle to the next stream created. That stream is a new
// registration: it gets the old stream's memory only after the old stream's fence, and nothing
// waits for the device meanwhile (review findings B3 and B5).
TEST(StreamOrder, AHandleThatComesBackForANewStreamIsANewStream) {
  fixture f;
  const stream_id a = f.sim->create_stream();
  auto x = f.reserve(8 * mib, a);
  const storage_handle xs = f.at(x);
  const std::uint64_t old_uid = f.sim->stream_uid(a);
  (void)f.sim->record_event(a).value();  // a kernel on A still uses x
  x.reset();                             // freed on A, then A is destroyed with its work queued
  f.end_batch();
  f.sim->destroy_stream(a);
  const stream_id again = f.sim->create_stream();
  ASSERT_EQ(again, a) << "the simulated driver reuses the handle, as CUDA usually does";
  auto y = f.reserve(8 * mib, again);
  EXPECT_FALSE(overlap(f.at(y), xs)) << "the new stream got the destroyed stream's memory at once";
  EXPECT_EQ(f.sim->waits(), 0u) << "the device thread waited for the old stream";
  EXPECT_EQ(f.m->statistics().stream_waits, 0u);
  EXPECT_EQ(f.m->statistics().stream_registrations, 2u);
  y.reset();
  f.fenced_batch();
  f.sim->progress_uid(old_uid);  // the old stream's queued work is done
  f.end_batch();
  auto z = f.reserve(8 * mib, stream_c);
  EXPECT_TRUE(overlap(f.at(z), xs)) << "after the old stream's fence the memory is free for everyone";
  EXPECT_EQ(f.m->check_invariants(), "");
}

TEST(StreamOrder, ARetiredStreamWhoseHandleComesBackNeverWaits) {
  fixture f;
  auto keep = f.reserve(4096, stream_b);
  const stream_id a = f.sim->create_stream();
  auto x = f.reserve(8 * mib, a);
  const storage_handle xs = f.at(x);
  (void)f.sim->record_event(a).value();
  x.reset();
  ASSERT_TRUE(f.m->retire_stream(a));
  f.sim->destroy_stream(a);
  const stream_id again = f.sim->create_stream();
  auto y = f.reserve(4096, again);
  auto other = f.reserve(4096, stream_b);
  EXPECT_FALSE(overlap(f.at(y), xs));
  EXPECT_EQ(f.sim->waits(), 0u);
  EXPECT_EQ(f.m->statistics().stream_waits, 0u);
  EXPECT_EQ(f.m->check_invariants(), "");
}

TEST(StreamOrder, StreamsThatAreGoneAreForgotten) {
  fixture f;
  auto keep = f.reserve(4096, streams::device);
  for (int i = 0; i < 500; ++i) {
    const stream_id s = f.sim->create_stream();
    auto h = f.reserve(mib, s);
    h.reset();
    f.sim->destroy_stream(s);
    if (i % 10 == 0) f.sim->progress();
    f.end_batch();
  }
  f.fenced_batch();
  f.sim->progress();
  f.end_batch();
  f.end_batch();
  EXPECT_LE(f.m->order().stream_count(), 2u) << "registrations of streams that are gone stay";
  EXPECT_EQ(f.m->statistics().stream_registrations, 501u);
  EXPECT_EQ(f.m->check_invariants(), "");
}

// Review finding B1 (reproducer R1): an explicit cleanup (empty_cache, configure) declared frees
// done without any event. Now it waits for nothing and hands out nothing early; the memory goes
// back once the fence passes.
TEST(StreamOrder, AnExplicitCleanupNeverWaitsAndNeverHandsOutBusyMemory) {
  fixture f(preset::automatic, 0, /*deferred=*/true);
  auto keep = f.reserve(4096, stream_b);
  auto x = f.reserve(8 * mib, stream_a);
  const storage_handle at = f.at(x);
  const event use = f.sim->record_event(stream_a).value();  // a kernel on A still uses x
  x.reset();
  f.end_batch();
  ASSERT_TRUE(f.m->cleanup(true));
  EXPECT_EQ(f.sim->waits(), 0u);
  EXPECT_TRUE(f.m->cleanup_owed());
  auto y = f.reserve(8 * mib, stream_b);
  EXPECT_FALSE(overlap(f.at(y), at) && !f.sim->has_passed(use))
      << "stream B got memory freed on A before any fence behind the free passed";
  y.reset();
  const std::uint64_t held = f.m->statistics().bytes_reserved;
  f.sim->progress();
  f.end_batch();
  f.end_batch();
  EXPECT_FALSE(f.m->cleanup_owed());
  EXPECT_LT(f.m->statistics().bytes_reserved, held) << "the owed memory did not go back";
  EXPECT_EQ(f.m->statistics().stream_waits, 0u);
  EXPECT_EQ(f.m->check_invariants(), "");
}

TEST(StreamOrder, ReclaimUnderMemoryPressureWaitsForTheFencesAndCountsIt) {
  fixture f(parse_layout("arena:slack=0").value(), 32 * mib);
  auto keep = f.reserve(4096, stream_b);
  auto x = f.reserve(24 * mib, stream_a);
  x.reset();
  f.end_batch();
  auto r = f.m->reserve(24 * mib, stream_b);  // only A's memory would fit
  ASSERT_TRUE(r) << r.err().message();
  EXPECT_EQ(f.m->statistics().stream_waits, 1u);
  EXPECT_GE(f.sim->waits(), 1u);
  EXPECT_EQ(f.m->check_invariants(), "");
}

TEST(StreamOrder, AFreeWhoseRecordFailedWaitsForADeviceSynchronization) {
  fixture f(parse_layout("arena:slack=0").value(), 32 * mib);
  auto keep = f.reserve(4096, stream_b);
  auto x = f.reserve(24 * mib, stream_a);
  const storage_handle at = f.at(x);
  f.sim->fail_next_free_record();
  x.reset();
  f.m->want_fences();
  EXPECT_FALSE(f.m->end_batch()) << "the failed record is reported";
  EXPECT_EQ(f.m->statistics().broken_streams, 1u);
  f.sim->progress();
  f.end_batch();
  auto small = f.reserve(4 * mib, stream_b);
  EXPECT_FALSE(overlap(f.at(small), at)) << "memory whose free was never recorded went to another stream";
  small.reset();
  const auto waits = f.sim->waits();
  auto r = f.m->reserve(24 * mib, stream_b);  // memory pressure: a device synchronization covers it
  ASSERT_TRUE(r) << r.err().message();
  EXPECT_GT(f.sim->waits(), waits);
  EXPECT_EQ(f.m->check_invariants(), "");
}

TEST(StreamOrder, AFailedRecordOnTheDevicesStreamKeepsItsFreesUnfenced) {
  fixture f;
  auto keep = f.reserve(4096, stream_b);  // frees carry their stream
  auto x = f.reserve(8 * mib, streams::device);
  const storage_handle at = f.at(x);
  x.reset();
  f.sim->fail_next_record();
  f.m->want_fences();
  EXPECT_FALSE(f.m->end_batch()) << "the failed record is reported";
  f.sim->progress();
  f.end_batch();
  auto y = f.reserve(8 * mib, stream_b);
  EXPECT_FALSE(overlap(f.at(y), at)) << "frees without a fence were taken for done";
  y.reset();
  f.fenced_batch();  // recorded now
  f.sim->progress();
  f.end_batch();
  auto z = f.reserve(8 * mib, stream_b);
  EXPECT_TRUE(overlap(f.at(z), at));
  EXPECT_EQ(f.m->check_invariants(), "");
}

TEST(StreamOrder, AFailedQueryIsNeverTakenForAPassedFence) {
  fixture f;
  auto keep = f.reserve(4096, stream_b);
  auto x = f.reserve(8 * mib, stream_a);
  const storage_handle at = f.at(x);
  x.reset();
  f.fenced_batch();
  f.sim->fail_next_query();
  f.end_batch();
  EXPECT_EQ(f.m->statistics().broken_streams, 1u);
  f.sim->progress();
  f.end_batch();
  auto y = f.reserve(8 * mib, stream_b);
  EXPECT_FALSE(overlap(f.at(y), at)) << "a failed query let the memory go";
  EXPECT_EQ(f.m->check_invariants(), "");
}

// Review finding B4: a stream of another GPU. It cannot be given memory of this device, but it
// may use it (peer access): record_stream tracks it with events of its own device.
TEST(StreamOrder, AStreamOfAnotherDeviceIsRefusedForAReserveAndTrackedForRecordStream) {
  fixture f;
  const stream_id foreign = f.sim->create_stream(/*device=*/1);
  auto r = f.m->reserve(mib, foreign);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.code(), errc::invalid_argument);
  EXPECT_NE(r.err().message().find("another device"), std::string::npos) << r.err().message();
  EXPECT_EQ(f.m->statistics().failed_reserves, 1u);
  auto x = f.reserve(8 * mib, stream_a);
  const storage_handle at = f.at(x);
  ASSERT_TRUE(f.m->record_stream(x.binding(), foreign));
  x.reset();
  f.end_batch();
  f.sim->progress_stream(stream_a);
  f.end_batch();
  auto y = f.reserve(8 * mib, stream_b);
  EXPECT_FALSE(overlap(f.at(y), at)) << "memory a kernel of the other device may still use was handed out";
  y.reset();
  f.sim->progress_stream(foreign);
  f.end_batch();
  auto z = f.reserve(8 * mib, stream_c);
  EXPECT_TRUE(overlap(f.at(z), at));
  EXPECT_EQ(f.m->check_invariants(), "");
}

TEST(StreamOrder, ConfigureWaitsForTheFencesOfFreedMemoryWithoutWaiting) {
  fixture f;
  auto x = f.reserve(8 * mib, stream_a);
  (void)f.sim->record_event(stream_a).value();
  x.reset();
  auto out = f.m->configure(preset::sub_slices);
  ASSERT_TRUE(out) << out.err().message();
  EXPECT_FALSE(out->applied);
  EXPECT_TRUE(out->pending) << "memory a stream may still use would have gone back";
  EXPECT_GE(out->pending_bytes, 8 * mib);
  EXPECT_EQ(out->live_allocations, 0u);
  EXPECT_EQ(f.sim->waits(), 0u);
  f.sim->progress();
  f.end_batch();
  out = f.m->configure(preset::sub_slices);
  ASSERT_TRUE(out) << out.err().message();
  EXPECT_TRUE(out->applied);
  EXPECT_EQ(f.m->check_invariants(), "");
}

// Review finding B2 (reproducer R2): a capture pinned a slice held for its stream's fence, and
// dropping the pin held it a second time; the stale entry later released another allocation early
// and teardown crashed.
TEST(StreamOrder, ACapturePinOnAHeldSliceHoldsItOnce) {
  fixture f;
  auto keep = f.reserve(4096, stream_b);
  f.m->capture_begin();
  auto w = f.reserve(mib, stream_a);  // persistent (capture window)
  detail::descriptor* d = w.raw();
  w.reset();  // freed inside the window: held for A's fence
  f.end_batch();
  auto pins = f.m->capture_end().value();
  ASSERT_EQ(pins.size(), 1u);
  EXPECT_EQ(pins[0].raw(), d) << "the pin shares the held descriptor";
  pins.clear();
  f.end_batch();
  f.sim->progress_stream(stream_a);
  f.end_batch();
  auto v = f.reserve(mib, stream_a);
  ASSERT_TRUE(f.m->record_stream(v.binding(), stream_b));
  const storage_handle v_at = f.at(v);
  v.reset();
  f.end_batch();
  f.sim->progress_stream(stream_a);  // A passes everything, B nothing
  f.end_batch();
  auto u = f.reserve(mib, stream_b);
  EXPECT_FALSE(f.at(u) == v_at) << "memory recorded for stream B was handed out before B's fence passed";
  EXPECT_EQ(f.m->check_invariants(), "");
  u.reset();
  keep.reset();
  f.m.reset();  // teardown with everything back: no stale entry left
}

// Review finding B11: bind gives the memory a new identity; the streams record_stream added stay.
TEST(StreamOrder, BindKeepsTheStreamsRecordStreamAdded) {
  fixture f;
  auto x = f.reserve(8 * mib, stream_a);
  const storage_handle at = f.at(x);
  ASSERT_TRUE(f.m->record_stream(x.binding(), stream_b));
  memory_handle y = memory_handle::make();
  ASSERT_TRUE(f.m->bind(std::move(x), y));
  y.reset();
  f.end_batch();
  f.sim->progress_stream(stream_a);
  f.end_batch();
  auto z = f.reserve(8 * mib, stream_c);
  EXPECT_FALSE(overlap(f.at(z), at)) << "bind dropped the stream record_stream had added";
  z.reset();
  f.sim->progress_stream(stream_b);
  f.end_batch();
  EXPECT_EQ(f.m->check_invariants(), "");
}

TEST(StreamOrder, TeardownWithWorkStillQueuedWaitsForTheDevice) {
  fixture f(preset::automatic, 0, /*deferred=*/true);
  auto x = f.reserve(8 * mib, stream_a);
  const event use = f.sim->record_event(stream_a).value();
  x.reset();
  auto* sim = f.sim;
  bool passed_before_any_return = true;
  sim->on_give_back = [&](const devices::sim_storage::given_back&) {
    passed_before_any_return = passed_before_any_return && sim->has_passed(use);
  };
  f.m.reset();
  EXPECT_TRUE(passed_before_any_return) << "memory went back to the driver while a stream still used it";
}

// The floor stream order sets: memory freed on a stream whose queued work still uses it is held
// beside what is in use, whatever the allocator. A reserve that maps counts both after its poll.
TEST(StreamOrder, ThePeakOfBusyMemoryCountsWhatAStreamStillUsesBesideWhatIsInUse) {
  fixture f;
  auto keep = f.reserve(4096, stream_a);
  auto b = f.reserve(8 * mib, stream_b);
  (void)f.sim->record_event(stream_b);  // a kernel on B still uses b
  b.reset();
  f.m->process_releases();
  EXPECT_EQ(f.m->statistics().peak_bytes_busy, 0u) << "no reserve has polled the fences yet";
  auto a = f.reserve(256 * mib, stream_a);  // fits in no mapped memory: polls, and B has not passed
  {
    const memory_statistics& st = f.m->statistics();
    EXPECT_GE(st.peak_bytes_busy, 4096 + 256 * mib + 8 * mib) << "what is in use and what B still uses";
    EXPECT_LT(st.peak_bytes_busy, 4096 + 256 * mib + 10 * mib);
    EXPECT_GT(st.peak_bytes_busy, st.peak_bytes_in_use);
    EXPECT_LE(st.peak_bytes_busy, st.peak_bytes_reserved) << "busy memory is held";
    EXPECT_NE(st.to_string().find("peak of in use and busy on streams"), std::string::npos) << st.to_string();
  }
  // B passes; after a reset the next reserve that maps finds nothing busy but what is in use.
  f.sim->progress();
  f.m->reset_peaks();
  EXPECT_EQ(f.m->statistics().peak_bytes_busy, 0u);
  auto c = f.reserve(512 * mib, stream_a);
  {
    const memory_statistics& st = f.m->statistics();
    EXPECT_EQ(st.peak_bytes_busy, st.peak_bytes_in_use);
    EXPECT_EQ(st.bytes_in_use, 4096 + 256 * mib + 512 * mib);
  }
  EXPECT_EQ(f.m->check_invariants(), "");
}

// One stream of the device's own frees at once: nothing is ever busy beside what is in use.
TEST(StreamOrder, OneStreamHasNoBusyMemoryToCount) {
  fixture f;
  auto h = f.reserve(8 * mib, streams::device);
  h.reset();
  auto g = f.reserve(256 * mib, streams::device);
  EXPECT_EQ(f.m->statistics().peak_bytes_busy, 0u);
  EXPECT_EQ(f.m->statistics().to_string().find("busy on streams"), std::string::npos);
}
