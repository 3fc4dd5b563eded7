// Graph-capture windows and the persistent-memory policy: ports of the reference's capture_* tests
// (memory_manage.rs) and of the mode/policy semantics (cubecl-behaviour.md §2.4, §2.10, §5.3).
//
// devrt differs from the reference where noted: capture_end without a window is an error
// (no_capture), configure during a window is refused (capture_active), and pins are per persistent
// slice touched in the window (reserved or bound), including slices freed again inside it.
#include "devrt/memory/memory_manager.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "devrt/devices/sim_storage.hpp"

namespace {

using namespace devrt;
using namespace devrt::memory;

constexpr std::uint64_t MiB = 1024 * 1024;
constexpr device_properties kProps{128 * MiB, 32, 0};

std::unique_ptr<memory_manager> make_mgr(memory_layout layout = preset::exclusive_pages,
                                         persistent_policy policy = persistent_policy::enabled,
                                         std::optional<allocation_mode> mode = std::nullopt) {
  devices::sim_options o;
  o.props = kProps;
  manager_options opts;
  opts.name = "capture-test";
  opts.layout = std::move(layout);
  opts.policy = policy;
  opts.mode = mode;
  return std::make_unique<memory_manager>(storage::make<devices::sim_storage>(o), std::move(opts));
}

memory_handle take(result<memory_handle> r) {
  if (!r) {
    ADD_FAILURE() << "reserve failed: " << r.err().message();
    return {};
  }
  return std::move(r).value();
}

std::vector<memory_handle> end_capture(memory_manager& m) {
  auto r = m.capture_end();
  if (!r) {
    ADD_FAILURE() << "capture_end failed: " << r.err().message();
    return {};
  }
  return std::move(r).value();
}

storage_handle storage_of(memory_manager& m, const memory_handle& h) {
  auto s = m.get_storage(h);
  if (!s) {
    ADD_FAILURE() << "get_storage failed: " << s.err().message();
    return {};
  }
  return *s;
}

bool is_persistent(const memory_handle& h) {
  return h.raw() != nullptr && h.raw()->loc.pool == location::persistent_pool;
}

// ------------------------------------------------------------------------------------------------
// capture_* of memory_manage.rs
// ------------------------------------------------------------------------------------------------

TEST(RefCapture, PinsReusedPersistentSlice) {
  auto m = make_mgr();
  // A first window allocates a persistent slice; everything is released afterwards.
  m->capture_begin();
  memory_handle first = take(m->reserve(1024));
  ASSERT_TRUE(is_persistent(first));
  const storage_id slice_id = storage_of(*m, first).id;
  first.reset();
  auto first_pins = end_capture(*m);
  EXPECT_EQ(first_pins.size(), 1u);
  first_pins.clear();
  EXPECT_EQ(m->usage().number_allocs, 0u);

  // A second window reuses that free slice: the reuse is pinned although the slice predates it.
  m->capture_begin();
  memory_handle second = take(m->reserve(1024));
  EXPECT_EQ(storage_of(*m, second).id, slice_id);
  EXPECT_EQ(m->statistics().driver_allocs, 1u);
  second.reset();
  auto pins = end_capture(*m);
  ASSERT_EQ(pins.size(), 1u) << "the reused slice must be retained";
  EXPECT_EQ(storage_of(*m, pins[0]).id, slice_id);
  EXPECT_EQ(m->usage().number_allocs, 1u) << "the pin keeps the slice live";

  // While pinned, no later allocation gets the slice.
  const memory_usage before = m->usage();
  memory_handle other = take(m->reserve(1024));
  EXPECT_GT(m->usage().bytes_reserved, before.bytes_reserved);
  // Also not a later persistent allocation of the same size, which would otherwise reuse it.
  m->mode(allocation_mode::persistent);
  memory_handle persistent_other = take(m->reserve(1024));
  m->mode(allocation_mode::automatic);
  ASSERT_TRUE(is_persistent(persistent_other));
  EXPECT_NE(storage_of(*m, persistent_other).id, slice_id) << "a pinned slice was handed to a later allocation";

  // Dropping the pins releases the slice for reuse.
  pins.clear();
  persistent_other.reset();
  m->mode(allocation_mode::persistent);
  memory_handle again = take(m->reserve(1024));
  memory_handle again2 = take(m->reserve(1024));
  const storage_id a = storage_of(*m, again).id;
  const storage_id b = storage_of(*m, again2).id;
  EXPECT_TRUE(a == slice_id || b == slice_id);
  EXPECT_EQ(m->check_invariants(), "");
}

TEST(RefCapture, PinsPreexistingSliceFreedAndReusedMidwindow) {
  auto m = make_mgr();
  // A persistent slice that is live when the next window opens.
  m->capture_begin();
  memory_handle live = take(m->reserve(1024));
  const storage_id slice_id = storage_of(*m, live).id;
  {
    auto first_pins = end_capture(*m);
    ASSERT_EQ(first_pins.size(), 1u);
    EXPECT_EQ(first_pins[0].id(), live.id()) << "a live touched slice is pinned through its own identity";
    EXPECT_FALSE(live.can_mut());
  }
  EXPECT_TRUE(live.can_mut());

  // The window frees it and reuses exactly that slice: the window touched it, so it is pinned.
  m->capture_begin();
  live.reset();
  memory_handle reused = take(m->reserve(1024));
  EXPECT_EQ(storage_of(*m, reused).id, slice_id);
  reused.reset();
  auto pins = end_capture(*m);
  ASSERT_EQ(pins.size(), 1u) << "a pre-existing slice freed and reused mid-window must be pinned";
  EXPECT_EQ(storage_of(*m, pins[0]).id, slice_id);
  EXPECT_EQ(m->check_invariants(), "");
}

TEST(RefCapture, DoesNotRetainUntouchedFreeSlices) {
  auto m = make_mgr();
  // An idle free slice left from an earlier window.
  m->capture_begin();
  take(m->reserve(1024));
  end_capture(*m);
  EXPECT_EQ(m->usage().number_allocs, 0u);

  // A window that only touches another size pins only what it touched.
  m->capture_begin();
  take(m->reserve(2048));
  auto pins = end_capture(*m);
  ASSERT_EQ(pins.size(), 1u) << "only the touched slice is retained, not the idle leftover";
  EXPECT_EQ(storage_of(*m, pins[0]).size, 2048u);
  EXPECT_EQ(m->usage().number_allocs, 1u);
  EXPECT_EQ(m->usage().bytes_in_use, 2048u);
  EXPECT_EQ(m->check_invariants(), "");
}

TEST(RefCapture, SurvivesExplicitCleanup) {
  auto m = make_mgr();
  m->capture_begin();
  memory_handle handle = take(m->reserve(1024));
  const storage_id slice_id = storage_of(*m, handle).id;
  handle.reset();
  // An explicit cleanup inside the window frees nothing.
  ASSERT_TRUE(m->cleanup(true));
  EXPECT_EQ(m->usage().bytes_reserved, 1024u);
  EXPECT_EQ(m->statistics().driver_frees, 0u);
  auto pins = end_capture(*m);
  ASSERT_EQ(pins.size(), 1u) << "pin lost across an explicit cleanup";
  EXPECT_EQ(storage_of(*m, pins[0]).id, slice_id);

  // After the window, dropping the pins and cleaning up returns the slice.
  pins.clear();
  ASSERT_TRUE(m->cleanup(true));
  EXPECT_EQ(m->usage().bytes_reserved, 0u);
  EXPECT_EQ(m->check_invariants(), "");
}

// The reference's second capture_end returned an empty list; devrt reports no_capture.
TEST(RefCapture, BeginIsReentrant) {
  auto m = make_mgr();
  ASSERT_EQ(m->current_mode(), allocation_mode::automatic);
  m->capture_begin();
  memory_handle first = take(m->reserve(1024));
  // A second begin keeps the pins and the saved mode of the window in flight.
  m->capture_begin();
  EXPECT_TRUE(m->capturing());
  memory_handle second = take(m->reserve(2048));
  first.reset();
  second.reset();
  auto pins = end_capture(*m);
  EXPECT_EQ(pins.size(), 2u) << "pins from before the re-entrant begin lost";
  EXPECT_FALSE(m->capturing());
  EXPECT_EQ(m->current_mode(), allocation_mode::automatic) << "the mode saved by the first begin is restored";

  auto again = m->capture_end();
  ASSERT_FALSE(again);
  EXPECT_EQ(again.code(), errc::no_capture);
  EXPECT_EQ(m->check_invariants(), "");
}

TEST(RefCapture, LeavesPreexistingBuffersAlone) {
  auto m = make_mgr();
  // A persistent buffer that predates the capture and stays alive through it.
  m->capture_begin();
  memory_handle preexisting = take(m->reserve(1024));
  end_capture(*m);

  m->capture_begin();
  take(m->reserve(2048));
  auto pins = end_capture(*m);
  ASSERT_EQ(pins.size(), 1u) << "only the window's slice belongs to the graph";
  EXPECT_NE(pins[0].id(), preexisting.id());
  EXPECT_TRUE(preexisting.can_mut()) << "a capture must not claim pre-existing live buffers";
  EXPECT_EQ(preexisting.use_count(), 1u);
  EXPECT_EQ(m->check_invariants(), "");
}

// ------------------------------------------------------------------------------------------------
// devrt's capture semantics
// ------------------------------------------------------------------------------------------------

TEST(RefCapture, EndWithoutBeginIsNoCapture) {
  auto m = make_mgr();
  auto r = m->capture_end();
  ASSERT_EQ(r.code(), errc::no_capture);
  EXPECT_NE(r.err().message().find("capture"), std::string::npos) << r.err().message();
  EXPECT_FALSE(m->capturing());
  EXPECT_EQ(m->check_invariants(), "");
}

TEST(RefCapture, ConfigureDuringCaptureIsRefused) {
  auto m = make_mgr(preset::sub_slices);
  m->capture_begin();
  auto r = m->configure(preset::exclusive_pages);
  ASSERT_EQ(r.code(), errc::capture_active);
  EXPECT_EQ(m->layout(), preset_pools(preset::sub_slices, kProps));
  // A layout error is still reported as such.
  auto bad = m->configure(memory_layout(std::vector<pool_config>{}));
  EXPECT_EQ(bad.code(), errc::empty_pool_list);
  end_capture(*m);

  auto ok = m->configure(preset::exclusive_pages);
  ASSERT_TRUE(ok) << ok.err().message();
  EXPECT_TRUE(ok->applied);
  EXPECT_EQ(m->layout(), preset_pools(preset::exclusive_pages, kProps));
  EXPECT_EQ(m->check_invariants(), "");
}

TEST(RefCapture, EveryReserveInTheWindowIsPersistent) {
  auto m = make_mgr(preset::sub_slices);
  memory_handle before = take(m->reserve(1000));
  EXPECT_FALSE(is_persistent(before));
  m->capture_begin();
  EXPECT_EQ(m->current_mode(), allocation_mode::persistent);
  memory_handle in_window = take(m->reserve(1000));
  memory_handle zero = take(m->reserve(0));
  EXPECT_TRUE(is_persistent(in_window));
  EXPECT_TRUE(is_persistent(zero));
  // Exact size, no bucket padding beyond the alignment.
  EXPECT_EQ(m->usage().bytes_reserved, 8 * MiB + 1024 + 32);
  auto pins = end_capture(*m);
  EXPECT_EQ(pins.size(), 2u);
  EXPECT_EQ(m->current_mode(), allocation_mode::automatic);
  memory_handle after = take(m->reserve(1000));
  EXPECT_FALSE(is_persistent(after));
  EXPECT_EQ(m->check_invariants(), "");
}

// A slice reserved several times in one window is pinned once; a live one through its identity.
TEST(RefCapture, PinsOncePerSlice) {
  auto m = make_mgr();
  m->capture_begin();
  take(m->reserve(1024));
  take(m->reserve(1024));
  memory_handle kept = take(m->reserve(1024));
  auto pins = end_capture(*m);
  ASSERT_EQ(pins.size(), 1u);
  EXPECT_EQ(pins[0].id(), kept.id());
  EXPECT_EQ(kept.use_count(), 2u);
  EXPECT_EQ(m->statistics().driver_allocs, 1u);
  EXPECT_EQ(m->check_invariants(), "");
}

// bind touches the slice: a persistent slice reserved before the window and bound inside it is
// pinned, through the assigned identity.
TEST(RefCapture, BindInsideWindowPinsSlice) {
  auto m = make_mgr();
  m->mode(allocation_mode::persistent);
  memory_handle reserved = take(m->reserve(512));
  memory_handle untouched = take(m->reserve(4096));
  m->mode(allocation_mode::automatic);
  ASSERT_TRUE(is_persistent(reserved));

  m->capture_begin();
  memory_handle assigned = memory_handle::make();
  ASSERT_TRUE(m->bind(std::move(reserved), assigned, 3));
  auto pins = end_capture(*m);
  ASSERT_EQ(pins.size(), 1u);
  EXPECT_EQ(pins[0].id(), assigned.id());
  EXPECT_EQ(*m->get_cursor(pins[0]), 3u);
  EXPECT_TRUE(untouched.can_mut());
  EXPECT_EQ(m->check_invariants(), "");
}

// A window that reserves and binds, as a client's create() does, pins the bound slice once.
TEST(RefCapture, ReserveThenBindInsideWindowPinsOnce) {
  auto m = make_mgr();
  m->capture_begin();
  memory_handle assigned = memory_handle::make();
  ASSERT_TRUE(m->bind(take(m->reserve(1000)), assigned));
  auto pins = end_capture(*m);
  ASSERT_EQ(pins.size(), 1u);
  EXPECT_EQ(pins[0].id(), assigned.id());
  EXPECT_EQ(m->check_invariants(), "");
}

// Freed slices pinned at capture_end get a fresh identity that holds them; dropping it frees them.
TEST(RefCapture, PinsOfFreedSlicesHoldTheMemory) {
  auto m = make_mgr();
  m->capture_begin();
  memory_handle a = take(m->reserve(1024));
  memory_handle b = take(m->reserve(2048));
  const memory_id old_a = a.id();
  a.reset();
  b.reset();
  EXPECT_EQ(m->usage().number_allocs, 0u);
  auto pins = end_capture(*m);
  ASSERT_EQ(pins.size(), 2u);
  EXPECT_NE(pins[0].id(), old_a);
  EXPECT_NE(pins[1].id(), old_a);
  const memory_usage u = m->usage();
  EXPECT_EQ(u.number_allocs, 2u);
  EXPECT_EQ(u.bytes_in_use, 1024u + 2048);
  for (auto& p : pins) {
    EXPECT_TRUE(p.can_mut());
    EXPECT_TRUE(m->get_storage(p));
  }
  pins.clear();
  EXPECT_EQ(m->usage().number_allocs, 0u);
  EXPECT_EQ(m->usage().bytes_reserved, 1024u + 2048) << "persistent slices stay until an explicit cleanup";
  EXPECT_EQ(m->check_invariants(), "");
}

// Inside the window, cleanup(false) does not tick the dynamic pools either.
TEST(RefCapture, NoPeriodicReleaseDuringWindow) {
  auto m = make_mgr(memory_layout(std::vector<pool_config>{
      sliced_pool_config{1024, std::nullopt, std::nullopt, 1},
  }));
  take(m->reserve(100));
  EXPECT_EQ(m->usage().bytes_reserved, 1024u);
  m->capture_begin();
  for (int i = 0; i < 5; ++i) {
    take(m->reserve(64));
    ASSERT_TRUE(m->cleanup(false));
  }
  EXPECT_EQ(m->usage().bytes_reserved, 1024u + 64) << "the idle sliced page is kept while capturing";
  end_capture(*m);
  EXPECT_EQ(m->check_invariants(), "");
}

// ------------------------------------------------------------------------------------------------
// mode() and the persistent-memory policy (§2.4, §5.3)
// ------------------------------------------------------------------------------------------------

TEST(RefPolicy, EnabledUsesPersistentOnlyWhenAsked) {
  auto m = make_mgr(preset::sub_slices, persistent_policy::enabled);
  EXPECT_EQ(m->policy(), persistent_policy::enabled);
  EXPECT_EQ(m->current_mode(), allocation_mode::automatic);
  EXPECT_FALSE(is_persistent(take(m->reserve(1024))));
  m->mode(allocation_mode::persistent);
  EXPECT_EQ(m->current_mode(), allocation_mode::persistent);
  memory_handle p = take(m->reserve(1024));
  EXPECT_TRUE(is_persistent(p));
  m->mode(allocation_mode::automatic);
  EXPECT_EQ(m->current_mode(), allocation_mode::automatic);
  // A free persistent slice of the same size is not used in automatic mode under `enabled`.
  p.reset();
  EXPECT_FALSE(is_persistent(take(m->reserve(1024))));
  EXPECT_EQ(m->check_invariants(), "");
}

TEST(RefPolicy, SizeMatchServesExistingPersistentSizes) {
  auto m = make_mgr(preset::sub_slices, persistent_policy::size_match);
  EXPECT_EQ(m->current_mode(), allocation_mode::automatic);
  EXPECT_FALSE(is_persistent(take(m->reserve(1024)))) << "no persistent slice of this size yet";

  m->mode(allocation_mode::persistent);
  memory_handle p = take(m->reserve(1024));
  m->mode(allocation_mode::automatic);
  ASSERT_TRUE(is_persistent(p));
  const storage_id p_id = m->get_storage(p)->id;

  // A live slice of the size exists: a new exact persistent slice.
  memory_handle q = take(m->reserve(1024));
  EXPECT_TRUE(is_persistent(q));
  EXPECT_NE(m->get_storage(q)->id, p_id);
  // Same aligned size (1000 -> 1024): persistent too.
  memory_handle r = take(m->reserve(1000));
  EXPECT_TRUE(is_persistent(r));
  // A free slice of the size is reused.
  p.reset();
  memory_handle s = take(m->reserve(1024));
  EXPECT_TRUE(is_persistent(s));
  EXPECT_EQ(m->get_storage(s)->id, p_id);
  // Other sizes stay dynamic.
  EXPECT_FALSE(is_persistent(take(m->reserve(2048))));
  EXPECT_EQ(m->check_invariants(), "");
}

TEST(RefPolicy, DisabledIgnoresModeButCaptureForcesPersistent) {
  auto m = make_mgr(preset::sub_slices, persistent_policy::disabled);
  EXPECT_EQ(m->current_mode(), allocation_mode::automatic);
  m->mode(allocation_mode::persistent);
  EXPECT_EQ(m->current_mode(), allocation_mode::automatic) << "mode() is ignored under disabled";
  EXPECT_FALSE(is_persistent(take(m->reserve(1024))));

  m->capture_begin();
  EXPECT_EQ(m->current_mode(), allocation_mode::persistent);
  memory_handle in_window = take(m->reserve(1024));
  EXPECT_TRUE(is_persistent(in_window));
  auto pins = end_capture(*m);
  EXPECT_EQ(pins.size(), 1u);
  EXPECT_EQ(m->current_mode(), allocation_mode::automatic);
  EXPECT_EQ(m->check_invariants(), "");
}

TEST(RefPolicy, EnforcedMakesEverythingPersistent) {
  auto m = make_mgr(preset::sub_slices, persistent_policy::enforced);
  EXPECT_EQ(m->current_mode(), allocation_mode::persistent);
  EXPECT_TRUE(is_persistent(take(m->reserve(1024))));
  m->mode(allocation_mode::automatic);
  EXPECT_EQ(m->current_mode(), allocation_mode::persistent) << "mode() is ignored under enforced";
  EXPECT_TRUE(is_persistent(take(m->reserve(4096))));
  // After a capture window the mode is still persistent.
  m->capture_begin();
  end_capture(*m);
  EXPECT_EQ(m->current_mode(), allocation_mode::persistent);
  EXPECT_EQ(m->usage().bytes_reserved, 1024u + 4096) << "no dynamic pool was used";
  EXPECT_EQ(m->check_invariants(), "");
}

// An explicit initial mode wins over the policy's default (the reference's Provided(mode)).
TEST(RefPolicy, ExplicitInitialMode) {
  auto p = make_mgr(preset::sub_slices, persistent_policy::enabled, allocation_mode::persistent);
  EXPECT_EQ(p->current_mode(), allocation_mode::persistent);
  EXPECT_TRUE(is_persistent(take(p->reserve(100))));
  auto a = make_mgr(preset::sub_slices, persistent_policy::enforced, allocation_mode::automatic);
  EXPECT_EQ(a->current_mode(), allocation_mode::automatic);
  EXPECT_FALSE(is_persistent(take(a->reserve(100))));
  EXPECT_EQ(p->check_invariants(), "");
  EXPECT_EQ(a->check_invariants(), "");
}

// mode() during a window changes the mode restored at its end, not the window's own mode.
TEST(RefPolicy, ModeDuringCaptureIsDeferred) {
  auto m = make_mgr(preset::sub_slices);
  m->capture_begin();
  m->mode(allocation_mode::persistent);
  EXPECT_EQ(m->current_mode(), allocation_mode::persistent);
  end_capture(*m);
  EXPECT_EQ(m->current_mode(), allocation_mode::persistent) << "the mode set during the window applies after it";

  m->capture_begin();
  m->mode(allocation_mode::automatic);
  EXPECT_EQ(m->current_mode(), allocation_mode::persistent) << "the window stays persistent";
  EXPECT_TRUE(is_persistent(take(m->reserve(100))));
  end_capture(*m);
  EXPECT_EQ(m->current_mode(), allocation_mode::automatic);
  EXPECT_FALSE(is_persistent(take(m->reserve(100))));
  EXPECT_EQ(m->check_invariants(), "");
}

}  // namespace
