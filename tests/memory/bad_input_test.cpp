// Bad input to the memory core, each case with the error and the message the caller gets:
// zero-size and enormous reserves, stale, never-initialized and freed handles given to lookups and
// to bind, binding twice, every invalid layout through every entry point (resolve_layout, the
// manager's constructor and create, configure), configure during a capture, capture_end without a
// begin. The manager stays consistent after each.
//
// Cases already covered elsewhere (config_test.cpp: each layout error of resolve_layout and the
// parsers; manager_test.cpp and handle_test.cpp: the codes of stale and unbound lookups and bind
// errors; capture_test.cpp: the codes of the capture errors) are not repeated; this file adds the
// messages, the boundaries and the entry points those tests leave out.

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "devrt/devices/host_storage.hpp"
#include "devrt/devices/sim_storage.hpp"
#include "devrt/memory/config.hpp"
#include "devrt/memory/memory_manager.hpp"

namespace {

using devrt::errc;
using devrt::devices::sim_options;
using devrt::devices::sim_storage;
using devrt::memory::allocation_mode;
using devrt::memory::exclusive_pool_config;
using devrt::memory::manager_options;
using devrt::memory::memory_binding;
using devrt::memory::memory_handle;
using devrt::memory::memory_layout;
using devrt::memory::memory_manager;
using devrt::memory::persistent_policy;
using devrt::memory::pool_config;
using devrt::memory::preset;
using devrt::memory::sliced_pool_config;
using devrt::memory::storage;

constexpr std::uint64_t kib = 1024;
constexpr std::uint64_t mib = 1024 * kib;
constexpr std::uint64_t gib = 1024 * mib;
constexpr std::uint64_t u64_max = std::numeric_limits<std::uint64_t>::max();

bool contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

sliced_pool_config sliced(std::uint64_t page, std::optional<std::uint64_t> slice = {},
                          std::optional<std::uint64_t> cap = {}, std::optional<std::uint64_t> period = {}) {
  sliced_pool_config c;
  c.page_size = page;
  c.max_slice_size = slice;
  c.max_pool_size = cap;
  c.dealloc_period = period;
  return c;
}

exclusive_pool_config exclusive(std::uint64_t max, std::optional<std::uint64_t> period = {}) {
  exclusive_pool_config c;
  c.max_alloc_size = max;
  c.dealloc_period = period;
  return c;
}

sim_options sim(std::uint64_t capacity = 0) {
  sim_options o;
  o.props.max_page_size = 128 * mib;
  o.props.alignment = 32;
  o.props.capacity = capacity;
  return o;
}

std::unique_ptr<memory_manager> make(memory_layout layout = preset::sub_slices, std::uint64_t capacity = 0,
                                     persistent_policy policy = persistent_policy::enabled) {
  manager_options o;
  o.name = "bad-input";
  o.layout = std::move(layout);
  o.policy = policy;
  return std::make_unique<memory_manager>(storage::make<sim_storage>(sim(capacity)), o);
}

// ---- Zero-size reserves ----

TEST(BadInputReserve, ZeroBytesInEveryKindOfPool) {
  struct layout_case {
    const char* name;
    memory_layout layout;
    std::optional<allocation_mode> mode;
  };
  const std::vector<layout_case> cases{
      {"sub-slices", preset::sub_slices, std::nullopt},
      {"exclusive-pages", preset::exclusive_pages, std::nullopt},
      {"sliced only", std::vector<pool_config>{sliced(4 * kib)}, std::nullopt},
      {"exclusive max=0", std::vector<pool_config>{exclusive(0)}, std::nullopt},
      {"persistent", preset::sub_slices, allocation_mode::persistent},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto m = make(c.layout);
    if (c.mode) m->mode(*c.mode);
    auto a = m->reserve(0);
    auto b = m->reserve(0);
    ASSERT_TRUE(a) << a.err().message();
    ASSERT_TRUE(b) << b.err().message();
    auto sa = m->get_storage(*a);
    auto sb = m->get_storage(*b);
    ASSERT_TRUE(sa && sb);
    EXPECT_EQ(sa->size, 0u);
    EXPECT_FALSE(sa->id == sb->id && sa->offset == sb->offset) << "two zero-size allocations share an address";
    EXPECT_EQ(m->usage().number_allocs, 2u);
    EXPECT_EQ(m->usage().bytes_in_use, 0u);
    // The empty view resolves; any trim past it is an error that says so.
    EXPECT_TRUE(m->get_resource(*a, 0, 0));
    auto past = m->get_resource(*a, 1);
    ASSERT_EQ(past.code(), errc::invalid_argument);
    EXPECT_TRUE(contains(past.err().message(), "offset_start is past the end of the allocation (1 > 0)"))
        << past.err().message();
    auto trim = m->get_resource(*a, std::nullopt, 1);
    ASSERT_EQ(trim.code(), errc::invalid_argument);
    EXPECT_TRUE(contains(trim.err().message(), "offset_end trims more than the view holds (1 > 0)"))
        << trim.err().message();
    EXPECT_EQ(m->check_invariants(), "");
  }
}

// ---- Enormous reserves ----

TEST(BadInputReserve, EnormousSizesAreBufferTooBigWithTheLimit) {
  auto m = make(std::vector<pool_config>{sliced(mib)});
  struct huge_case {
    std::uint64_t size;
    std::uint64_t limit;
    const char* why;
  };
  const std::uint64_t cap = memory_manager::max_reserve_size;
  const std::vector<huge_case> cases{
      {2 * mib, mib, "larger than the largest pool"},
      {cap, mib, "exactly the largest size a reserve accepts: the pools decide"},
      {cap + 1, cap, "one byte past the largest reserve"},
      {u64_max - 31, cap, "a size that would wrap when aligned"},
      {u64_max, cap, "the largest 64-bit size"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.why);
    auto r = m->reserve(c.size);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.code(), errc::buffer_too_big);
    EXPECT_FALSE(devrt::is_transient(r.code())) << "buffer_too_big is permanent";
    EXPECT_EQ(r.err().size, c.size);
    EXPECT_EQ(r.err().limit, c.limit);
    const std::string msg = r.err().message();
    EXPECT_TRUE(contains(msg, "cannot allocate " + std::to_string(c.size) + " bytes")) << msg;
    EXPECT_TRUE(contains(msg, "takes " + std::to_string(c.limit) + " bytes")) << msg;
  }
  EXPECT_EQ(m->usage().bytes_reserved, 0u);
  EXPECT_EQ(m->statistics().failed_reserves, cases.size());
  EXPECT_EQ(m->check_invariants(), "");
}

// A sliced pool takes its slices and whole pages (above four fifths of a page), not the sizes in
// between: the error says which sizes the layout takes rather than only its largest pool's.
TEST(BadInputReserve, ASizeInTheGapOfASlicedPoolNamesTheSizesTheLayoutTakes) {
  auto m = make(std::vector<pool_config>{sliced(64 * mib, 8 * mib)});
  auto r = m->reserve(9 * mib);
  ASSERT_EQ(r.code(), errc::buffer_too_big);
  EXPECT_EQ(r.err().limit, 64 * mib);
  const std::string msg = r.err().message();
  EXPECT_TRUE(contains(msg, "cannot allocate " + std::to_string(9 * mib) + " bytes")) << msg;
  EXPECT_TRUE(contains(msg, "the layout takes up to 8.00 MiB, 51.20 MiB to 64.00 MiB")) << msg;
  ASSERT_TRUE(m->reserve(8 * mib)) << "the largest slice";
  ASSERT_TRUE(m->reserve(52 * mib)) << "a whole page";
  // A capped sliced pool takes no whole pages: one range, and the plain message.
  auto capped = make(std::vector<pool_config>{sliced(64 * mib, 8 * mib, 128 * mib)});
  const std::string plain = capped->reserve(9 * mib).err().message();
  EXPECT_FALSE(contains(plain, "the layout takes")) << plain;
  EXPECT_TRUE(contains(plain, "the largest pool takes " + std::to_string(8 * mib) + " bytes")) << plain;
}

TEST(BadInputReserve, LargerThanTheDeviceCapacity) {
  auto m = make(preset::sub_slices, 4 * gib);
  for (std::uint64_t size : {4 * gib + 1, 64 * gib, u64_max}) {
    auto r = m->reserve(size);
    ASSERT_EQ(r.code(), errc::buffer_too_big) << size;
    EXPECT_EQ(r.err().size, size);
    EXPECT_EQ(r.err().limit, 4 * gib) << "the limit is the device's capacity";
    EXPECT_TRUE(contains(r.err().message(), std::to_string(size))) << r.err().message();
    EXPECT_TRUE(
        contains(r.err().message(), "larger than the device: it takes " + std::to_string(4 * gib) + " bytes at most"))
        << r.err().message();
  }
  // In persistent mode too: the persistent pool has no size limit of its own.
  m->mode(allocation_mode::persistent);
  auto p = m->reserve(4 * gib + 1);
  ASSERT_EQ(p.code(), errc::buffer_too_big);
  EXPECT_EQ(p.err().limit, 4 * gib);
  EXPECT_EQ(m->usage().bytes_reserved, 0u);
  EXPECT_EQ(m->check_invariants(), "");
}

TEST(BadInputReserve, EnormousPersistentReserveOnTheHostIsOutOfMemory) {
  manager_options o;
  o.name = "host";
  o.layout = preset::sub_slices;
  o.mode = allocation_mode::persistent;
  memory_manager m(storage::make<devrt::devices::host_storage>(), o);
  // Within the largest reserve, so it reaches the device: the host cannot map 2^62 bytes.
  auto r = m.reserve(memory_manager::max_reserve_size);
  ASSERT_FALSE(r) << "the host mapped 2^62 bytes";
  EXPECT_EQ(r.code(), errc::out_of_memory);
  EXPECT_EQ(r.err().size, memory_manager::max_reserve_size);
  EXPECT_TRUE(contains(r.err().message(), "refused " + std::to_string(memory_manager::max_reserve_size) + " bytes"))
      << r.err().message();
  EXPECT_EQ(m.statistics().out_of_memory, 1u);
  EXPECT_EQ(m.usage().bytes_reserved, 0u);
  EXPECT_EQ(m.check_invariants(), "");
  // The manager keeps working.
  auto ok = m.reserve(4096);
  ASSERT_TRUE(ok) << ok.err().message();
  EXPECT_EQ(m.check_invariants(), "");
}

// ---- Lookups of handles without memory ----

TEST(BadInputHandles, NeverInitializedHandleAndBindingSayWhy) {
  auto m = make();
  memory_handle fresh = memory_handle::make();
  memory_binding b = fresh.binding();
  for (const auto& e : {m->get_storage(fresh).err(), m->get_cursor(fresh).err(), m->get_resource(fresh).err(),
                        m->get_storage(b).err(), m->get_cursor(b).err(), m->get_resource(b).err()}) {
    EXPECT_EQ(e.code, errc::not_found);
    EXPECT_TRUE(contains(e.message(), "memory not found: the memory location was never initialized")) << e.message();
  }
  auto bound = m->bind(fresh, memory_handle::make());
  ASSERT_EQ(bound.code(), errc::not_found);
  EXPECT_TRUE(contains(bound.err().message(), "never initialized")) << bound.err().message();
  EXPECT_EQ(m->check_invariants(), "");
}

TEST(BadInputHandles, StaleHandleAndBindingSayWhy) {
  auto m = make();
  memory_handle reserved = m->reserve(1000).value();
  memory_handle stale = reserved;
  memory_binding stale_binding = reserved.binding();
  memory_handle assigned = memory_handle::make();
  ASSERT_TRUE(m->bind(std::move(reserved), assigned));
  for (const auto& e : {m->get_storage(stale).err(), m->get_cursor(stale).err(), m->get_resource(stale).err(),
                        m->get_storage(stale_binding).err(), m->get_resource(stale_binding, 0, 0).err()}) {
    EXPECT_EQ(e.code, errc::not_found);
    const std::string msg = e.message();
    EXPECT_TRUE(contains(msg, "memory not found")) << msg;
    EXPECT_TRUE(contains(msg, "stale (replaced by bind)")) << "the message names the likely cause: " << msg;
  }
  EXPECT_EQ(m->get_storage(assigned)->size, 1000u);
  EXPECT_EQ(m->check_invariants(), "");
}

TEST(BadInputHandles, BindingAFreedHandle) {
  auto m = make();
  // A handle dropped with reset() is empty.
  memory_handle dropped = m->reserve(64).value();
  dropped.reset();
  auto empty_reserved = m->bind(dropped, memory_handle::make());
  ASSERT_EQ(empty_reserved.code(), errc::not_found);
  EXPECT_TRUE(contains(empty_reserved.err().message(), "the handle is empty")) << empty_reserved.err().message();
  // An empty handle to give the memory to.
  memory_handle live = m->reserve(64).value();
  auto empty_assigned = m->bind(live, memory_handle{});
  ASSERT_EQ(empty_assigned.code(), errc::invalid_argument);
  EXPECT_TRUE(contains(empty_assigned.err().message(), "the handle to bind is empty"))
      << empty_assigned.err().message();
  EXPECT_TRUE(m->get_storage(live)) << "a failed bind consumed the memory";
  // A stale copy whose memory has since been freed by its new owner.
  memory_handle reserved = m->reserve(128).value();
  memory_handle stale = reserved;
  memory_handle owner = memory_handle::make();
  ASSERT_TRUE(m->bind(std::move(reserved), owner));
  owner.reset();  // the memory is free now
  auto freed = m->bind(stale, memory_handle::make());
  ASSERT_EQ(freed.code(), errc::not_found);
  EXPECT_EQ(m->usage().number_allocs, 1u) << "only `live` is live";
  // A handle whose manager is gone, given to another manager.
  memory_handle orphan;
  {
    auto gone = make();
    orphan = gone->reserve(64).value();
  }
  auto foreign = m->bind(orphan, memory_handle::make());
  ASSERT_EQ(foreign.code(), errc::not_found);
  EXPECT_TRUE(contains(foreign.err().message(), "memory not found")) << foreign.err().message();
  EXPECT_EQ(m->get_storage(orphan).code(), errc::not_found);
  EXPECT_EQ(m->usage().number_allocs, 1u);
  EXPECT_EQ(m->check_invariants(), "");
}

TEST(BadInputHandles, BindingTwice) {
  auto m = make();
  memory_handle reserved = m->reserve(256).value();
  memory_handle copy = reserved;
  memory_handle first = memory_handle::make();
  ASSERT_TRUE(m->bind(std::move(reserved), first));
  // The same memory again, through a copy of the consumed handle: it is stale now.
  auto again = m->bind(copy, memory_handle::make());
  ASSERT_EQ(again.code(), errc::not_found);
  EXPECT_TRUE(contains(again.err().message(), "stale")) << again.err().message();
  // Other memory into the handle that already received some.
  memory_handle other = m->reserve(256).value();
  auto twice = m->bind(other, first);
  ASSERT_EQ(twice.code(), errc::already_bound);
  EXPECT_EQ(twice.err().message(),
            "the handle to bind already has memory: bind needs a fresh handle from memory_handle::make()");
  // A handle bound to itself.
  EXPECT_EQ(m->bind(other, other).code(), errc::already_bound);
  // Nothing moved.
  EXPECT_EQ(m->get_storage(first)->size, 256u);
  EXPECT_EQ(m->get_storage(other)->size, 256u);
  EXPECT_EQ(m->usage().number_allocs, 2u);
  EXPECT_EQ(m->check_invariants(), "");
}

// ---- Every invalid layout, through every entry point ----

struct invalid_layout {
  const char* name;
  memory_layout layout;
  errc code;
  std::vector<std::string> needles;
};

std::vector<invalid_layout> invalid_layouts() {
  return {
      {"empty pool list", std::vector<pool_config>{}, errc::empty_pool_list, {"the pool list is empty"}},
      {"too many pools", std::vector<pool_config>(255, exclusive(kib)), errc::too_many_pools, {"255 pools", "254"}},
      {"zero page", std::vector<pool_config>{sliced(0)}, errc::zero_size, {"(pool 0)", "`page_size` must be non-zero"}},
      {"zero slice",
       std::vector<pool_config>{exclusive(kib), sliced(kib, 0)},
       errc::zero_size,
       {"(pool 1)", "`max_slice_size`"}},
      {"zero cap", std::vector<pool_config>{sliced(kib, std::nullopt, 0)}, errc::zero_size, {"`max_pool_size`"}},
      {"zero sliced period",
       std::vector<pool_config>{sliced(kib, std::nullopt, std::nullopt, 0)},
       errc::zero_size,
       {"`dealloc_period`"}},
      {"zero exclusive period", std::vector<pool_config>{exclusive(kib, 0)}, errc::zero_size, {"`dealloc_period`"}},
      {"slice larger than page",
       std::vector<pool_config>{sliced(mib, 2 * mib)},
       errc::slice_larger_than_page,
       {"max_slice_size (2097152 bytes)", "page_size (1048576 bytes)"}},
      {"cap smaller than page",
       std::vector<pool_config>{sliced(mib, std::nullopt, mib / 2)},
       errc::cap_smaller_than_page,
       {"max_pool_size (524288 bytes)", "page_size (1048576 bytes)"}},
      {"too many pages",
       std::vector<pool_config>{sliced(kib, std::nullopt, gib)},
       errc::too_many_pages,
       {"1048576 pages", "65535"}},
      {"a size above 2^62",
       std::vector<pool_config>{exclusive((std::uint64_t{1} << 62) + 1)},
       errc::malformed_size,
       {"pool 0: max_alloc_size = 4611686018427387905", "at most 2^62"}},
  };
}

TEST(BadInputLayout, EveryInvalidLayoutThroughEveryEntryPoint) {
  for (const auto& c : invalid_layouts()) {
    SCOPED_TRACE(c.name);
    const auto check = [&](const devrt::error& e, const char* where) {
      EXPECT_EQ(e.code, c.code) << where << ": " << e.message();
      EXPECT_TRUE(devrt::is_config_error(e.code)) << where;
      for (const auto& n : c.needles) EXPECT_TRUE(contains(e.message(), n)) << where << ": " << e.message();
    };
    // resolve_layout.
    auto resolved = devrt::memory::resolve_layout(c.layout, sim().props);
    ASSERT_FALSE(resolved);
    check(resolved.err(), "resolve_layout");
    // memory_manager::create returns it; the constructor throws it.
    manager_options o;
    o.layout = c.layout;
    auto created = memory_manager::create(storage::make<sim_storage>(sim()), o);
    ASSERT_FALSE(created);
    check(created.err(), "create");
    try {
      memory_manager m(storage::make<sim_storage>(sim()), o);
      ADD_FAILURE() << "the constructor accepted an invalid layout";
    } catch (const devrt::exception& e) {
      check(e.err(), "constructor");
      EXPECT_EQ(std::string(e.what()), e.err().message());
    }
    // configure refuses it and keeps the layout and the memory.
    auto m = make();
    memory_handle live = m->reserve(1000).value();
    const auto before = m->layout();
    auto r = m->configure(c.layout);
    ASSERT_FALSE(r);
    check(r.err(), "configure");
    EXPECT_EQ(m->layout(), before);
    EXPECT_TRUE(m->get_storage(live));
    EXPECT_EQ(m->check_invariants(), "");
  }
}

TEST(BadInputLayout, TextLayoutsThatParseButDoNotResolve) {
  // The command-line form: parse_layout accepts the shape; resolve_layout refuses the values.
  const std::vector<std::pair<const char*, errc>> cases{
      {"sliced:page=0", errc::zero_size},
      {"sliced:page=1MiB,slice=2MiB", errc::slice_larger_than_page},
      {"sliced:page=1MiB,cap=1KiB", errc::cap_smaller_than_page},
      {"sliced:page=1KiB,cap=1GiB", errc::too_many_pages},
      {"sliced:page=1MiB,period=0", errc::zero_size},
      {"exclusive:max=1MiB,period=0", errc::zero_size},
  };
  for (const auto& [text, code] : cases) {
    auto parsed = devrt::memory::parse_layout(text);
    ASSERT_TRUE(parsed) << text << ": " << parsed.err().message();
    auto r = devrt::memory::resolve_layout(*parsed, sim().props);
    ASSERT_FALSE(r) << text;
    EXPECT_EQ(r.code(), code) << text << ": " << r.err().message();
  }
}

// Sizes within one alignment unit of 2^64 would wrap around when resolve_layout aligns them (a page
// or a maximum of 0 bytes, a slice check passed by a wrapped slice, and with a cap a division by
// zero): they are refused instead, as malformed sizes naming the pool and the field.
TEST(BadInputLayout, SizesNearTwoToTheSixtyFourAreRefusedNotWrapped) {
  struct near_case {
    const char* text;
    const char* field;
  };
  for (const auto& c : {near_case{"sliced:page=18446744073709551615", "page_size"},
                        near_case{"exclusive:max=18446744073709551615", "max_alloc_size"},
                        near_case{"sliced:page=1MiB,slice=18446744073709551615", "max_slice_size"},
                        near_case{"sliced:page=18446744073709551615,cap=1GiB", "page_size"},
                        near_case{"sliced:page=1MiB,cap=18446744073709551615", "max_pool_size"}}) {
    auto parsed = devrt::memory::parse_layout(c.text);
    ASSERT_TRUE(parsed) << c.text;
    auto r = devrt::memory::resolve_layout(*parsed, sim().props);
    ASSERT_FALSE(r) << c.text << " resolved";
    EXPECT_TRUE(devrt::is_config_error(r.code())) << c.text << ": " << r.err().message();
    EXPECT_TRUE(contains(r.err().message(), "pool 0")) << r.err().message();
    EXPECT_TRUE(contains(r.err().message(), c.field)) << r.err().message();
    // The manager refuses it the same way, without a crash.
    manager_options o;
    o.layout = *parsed;
    EXPECT_EQ(memory_manager::create(storage::make<sim_storage>(sim()), o).code(), r.code()) << c.text;
  }
  // 2^62 itself is still a size a layout may use.
  auto edge = devrt::memory::parse_layout("exclusive:max=4611686018427387904");
  ASSERT_TRUE(edge);
  EXPECT_TRUE(devrt::memory::resolve_layout(*edge, sim().props));
}

// A fraction of a unit rounds down to the exact floor in bytes (exact values in the comments).
TEST(BadInputSizes, FractionsRoundDownExactly) {
  EXPECT_EQ(devrt::memory::parse_size("0.0009765625KiB").value(), 1u);     // 1024 * 0.0009765625 = 1
  EXPECT_EQ(devrt::memory::parse_size("0.9990234375KiB").value(), 1023u);  // = 1023
  EXPECT_EQ(devrt::memory::parse_size("1.0009765625KiB").value(), 1025u);  // = 1025
  EXPECT_EQ(devrt::memory::parse_size("15.99999999999999999999999TiB").value(), 16 * 1024 * gib - 1);
}

// ---- Capture windows ----

TEST(BadInputCapture, ConfigureDuringACaptureAndCaptureEndWithoutABegin) {
  auto m = make();
  auto none = m->capture_end();
  ASSERT_EQ(none.code(), errc::no_capture);
  EXPECT_EQ(none.err().message(), "no capture window is open: capture_end was called without capture_begin");

  m->capture_begin();
  memory_handle in_window = m->reserve(4096).value();
  // A valid layout is refused while the window is open ...
  auto busy = m->configure(preset::exclusive_pages);
  ASSERT_EQ(busy.code(), errc::capture_active);
  EXPECT_EQ(busy.err().message(),
            "not allowed during a capture: the pool layout cannot change while a capture window is open");
  // ... and an invalid one is reported as invalid first.
  EXPECT_EQ(m->configure(std::vector<pool_config>{}).code(), errc::empty_pool_list);
  EXPECT_TRUE(m->capturing()) << "a refused configure closed the window";
  auto pins = m->capture_end();
  ASSERT_TRUE(pins) << pins.err().message();
  EXPECT_EQ(pins->size(), 1u);
  // A second end has no window to close.
  auto twice = m->capture_end();
  ASSERT_EQ(twice.code(), errc::no_capture);
  EXPECT_TRUE(contains(twice.err().message(), "without capture_begin")) << twice.err().message();
  // The window is closed: configure applies once the dynamic pools hold nothing live.
  auto applied = m->configure(preset::exclusive_pages);
  ASSERT_TRUE(applied) << applied.err().message();
  EXPECT_TRUE(applied->applied) << "the capture's memory is persistent and does not block reconfiguration";
  EXPECT_EQ(m->check_invariants(), "");
}

}  // namespace
