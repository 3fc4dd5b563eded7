// libFuzzer target: the input bytes are a program of operations on a memory manager over sim
// storage: reserve, copy, drop, bindings, bind, views, cleanup, flush, configure, capture windows,
// mode changes, and injected device faults (a failing allocation, a failing flush, a smaller
// capacity), on devices that map memory (arenas) and devices that do not.
//
// A model follows every descriptor the program holds (live, stale after bind, or never bound) with
// its size and cursor. After every operation, aborting on a violation:
// - check_invariants() is empty;
// - usage() counts exactly the live allocations the program holds, and their bytes;
// - every handle and binding resolves as the model says (size and cursor), stale and unbound
//   ones are not_found (after every operation that can move memory, and every 16 operations);
// - the sim device holds exactly the bytes the manager reports reserved once nothing is queued;
// - each operation fails only with the errors its contract lists.
// At the end, with everything dropped and an explicit cleanup, the device holds nothing.

#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <initializer_list>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "devrt/devices/sim_storage.hpp"
#include "devrt/memory/memory_manager.hpp"

namespace {

using devrt::errc;
namespace mem = devrt::memory;
using mem::memory_binding;
using mem::memory_handle;
using descriptor = mem::detail::descriptor;

constexpr std::uint64_t kib = 1024;
constexpr std::uint64_t mib = 1024 * kib;

mem::device_properties device(std::uint64_t max_page, std::uint64_t alignment, std::uint64_t capacity,
                              std::uint64_t map_granularity = 0) {
  mem::device_properties p;
  p.max_page_size = max_page;
  p.alignment = alignment;
  p.capacity = capacity;
  p.map_granularity = map_granularity;
  return p;
}

mem::arena_pool_config arena(std::optional<std::uint64_t> granule = {}, std::optional<std::uint64_t> max = {},
                             std::optional<std::uint64_t> space = {}, std::optional<std::uint64_t> chunk = {},
                             std::optional<std::uint64_t> slack = {}) {
  mem::arena_pool_config c;
  c.granule = granule;
  c.max_alloc_size = max;
  c.address_space = space;
  c.chunk = chunk;
  c.slack = slack;
  return c;
}

mem::sliced_pool_config sliced(std::uint64_t page, std::optional<std::uint64_t> slice = {},
                               std::optional<std::uint64_t> cap = {}, std::optional<std::uint64_t> period = {}) {
  mem::sliced_pool_config c;
  c.page_size = page;
  c.max_slice_size = slice;
  c.max_pool_size = cap;
  c.dealloc_period = period;
  return c;
}

mem::exclusive_pool_config exclusive(std::uint64_t max, std::optional<std::uint64_t> period = {}) {
  mem::exclusive_pool_config c;
  c.max_alloc_size = max;
  c.dealloc_period = period;
  return c;
}

/// Layouts a program can configure: presets, fixed pool lists (some capped, some with periods,
/// arenas), and invalid ones (arenas are invalid on a device that does not map memory).
mem::memory_layout layout_choice(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 15)) {
    case 0: return mem::preset::sub_slices;
    case 1: return mem::preset::exclusive_pages;
    case 2: return std::vector<mem::pool_config>{sliced(64 * kib, 16 * kib, 256 * kib), exclusive(mib, 10)};
    case 3:
      return std::vector<mem::pool_config>{exclusive(0), sliced(256 * kib, std::nullopt, std::nullopt, 5), sliced(mib)};
    case 4: return std::vector<mem::pool_config>{exclusive(4 * kib, 3), exclusive(256 * kib), sliced(4 * mib)};
    case 5: return std::vector<mem::pool_config>{sliced(8 * kib, 1 * kib, 8 * kib)};  // one page, capped
    case 6: {
      // A small pool list from the input: may be valid or not.
      std::vector<mem::pool_config> pools;
      const int n = in.ConsumeIntegralInRange<int>(0, 3);
      for (int i = 0; i < n; ++i) {
        const auto size = [&] { return std::uint64_t{1} << in.ConsumeIntegralInRange<int>(0, 22); };
        if (in.ConsumeBool()) {
          pools.emplace_back(exclusive(
              size(), in.ConsumeBool() ? std::optional<std::uint64_t>(in.ConsumeIntegralInRange<std::uint64_t>(0, 20))
                                       : std::nullopt));
        } else {
          const std::uint64_t page = size();
          pools.emplace_back(sliced(
              page, in.ConsumeBool() ? std::optional<std::uint64_t>(size()) : std::nullopt,
              in.ConsumeBool() ? std::optional<std::uint64_t>(page * in.ConsumeIntegralInRange<std::uint64_t>(0, 4))
                               : std::nullopt,
              in.ConsumeBool() ? std::optional<std::uint64_t>(in.ConsumeIntegralInRange<std::uint64_t>(0, 20))
                               : std::nullopt));
        }
      }
      return pools;
    }
    case 7: return std::vector<mem::pool_config>{};                                         // empty_pool_list
    case 8: return std::vector<mem::pool_config>{sliced(4 * kib, 8 * kib)};                 // slice_larger_than_page
    case 9: return std::vector<mem::pool_config>{sliced(64 * kib, std::nullopt, 4 * kib)};  // cap_smaller_than_page
    case 10: return mem::preset::automatic;
    case 11: return mem::preset::arena;
    case 12: return std::vector<mem::pool_config>{arena()};
    case 13:  // a small arena: a tight address space, small chunks, a slack
      return std::vector<mem::pool_config>{exclusive(0), arena(std::nullopt, mib, 16 * mib, 256 * kib, 512 * kib)};
    case 14:
      return std::vector<mem::pool_config>{sliced(64 * kib, 16 * kib), arena(std::nullopt, std::nullopt, 64 * mib)};
    default: {
      // An arena from the input: may be valid or not.
      const auto maybe = [&](int lo, int hi) {
        return in.ConsumeBool()
                   ? std::optional<std::uint64_t>(std::uint64_t{1} << in.ConsumeIntegralInRange<int>(lo, hi))
                   : std::nullopt;
      };
      return std::vector<mem::pool_config>{
          arena(maybe(9, 22), maybe(0, 24), maybe(16, 27), maybe(16, 26), maybe(0, 24))};
    }
  }
}

std::uint64_t size_choice(FuzzedDataProvider& in, const mem::device_properties& props) {
  switch (in.ConsumeIntegralInRange<int>(0, 9)) {
    case 0: return 0;
    case 1: return in.ConsumeIntegralInRange<std::uint64_t>(1, 64);
    case 2:
    case 3: return in.ConsumeIntegralInRange<std::uint64_t>(65, 4 * kib);
    case 4: return in.ConsumeIntegralInRange<std::uint64_t>(4 * kib, 64 * kib);
    case 5: return in.ConsumeIntegralInRange<std::uint64_t>(64 * kib, mib);
    case 6: return in.ConsumeIntegralInRange<std::uint64_t>(mib, 8 * mib);
    case 7: return in.ConsumeIntegralInRange<std::uint64_t>(8 * mib, std::max(8 * mib, 2 * props.max_page_size));
    case 8: {
      const std::uint64_t edges[] = {mem::memory_manager::max_reserve_size,
                                     mem::memory_manager::max_reserve_size + 1,
                                     UINT64_MAX,
                                     UINT64_MAX - 1,
                                     props.capacity,
                                     props.capacity + 1,
                                     props.max_page_size,
                                     props.max_page_size + 1};
      return edges[in.ConsumeIntegralInRange<std::size_t>(0, std::size(edges) - 1)];
    }
    default: {
      // Sizes already used are common in real programs (reuse, size-match).
      static const std::uint64_t common[] = {256, 1000, 4096, 64 * kib, mib};
      return common[in.ConsumeIntegralInRange<std::size_t>(0, std::size(common) - 1)];
    }
  }
}

class program {
 public:
  program(FuzzedDataProvider& in) : in_(in) {}

  void run() {
    static const mem::device_properties devices[] = {
        device(mib, 32, 0),
        device(64 * mib, 512, 0),
        device(mib, 512, 8 * mib),
        device(4 * mib, 1, 0),
        device(4 * mib, 512, 256 * mib, 64 * kib),  // maps memory: arenas (address space 512 MiB)
        device(mib, 512, 16 * mib, 2 * mib),        // maps memory in 2 MiB granules, small capacity
    };
    props_ = devices[in_.ConsumeIntegralInRange<std::size_t>(0, std::size(devices) - 1)];
    const mem::persistent_policy policies[] = {mem::persistent_policy::enabled, mem::persistent_policy::size_match,
                                               mem::persistent_policy::disabled, mem::persistent_policy::enforced};
    policy_ = policies[in_.ConsumeIntegralInRange<std::size_t>(0, 3)];
    mem::manager_options opts;
    opts.name = "fuzz";
    opts.layout = layout_choice(in_);
    opts.policy = policy_;
    devrt::devices::sim_options so;
    so.props = props_;
    auto created = mem::memory_manager::create(mem::storage::make<devrt::devices::sim_storage>(so), opts);
    if (!created) {
      if (!devrt::is_config_error(created.code())) fail("create: " + created.err().message());
      return;
    }
    m_ = std::move(*created);
    sim_ = m_->backing_storage().backend<devrt::devices::sim_storage>();
    mode_ = policy_ == mem::persistent_policy::enforced ? mem::allocation_mode::persistent
                                                        : mem::allocation_mode::automatic;
    check("start", true);
    for (int step = 0; step < 300 && in_.remaining_bytes() > 0; ++step) {
      const bool deep = op();
      check(log_.empty() ? "?" : log_.back(), deep || step % 16 == 15);
    }
    finish();
  }

 private:
  enum class state { live, stale, unbound };
  struct model {
    state s = state::live;
    std::uint64_t size = 0;
    std::uint64_t cursor = 0;
  };

  [[noreturn]] void fail(const std::string& what) {
    std::fprintf(stderr, "fuzz_ops: %s\nlast operations:\n", what.c_str());
    for (const auto& l : log_) std::fprintf(stderr, "  %s\n", l.c_str());
    if (m_) std::fprintf(stderr, "%s\n", m_->report().c_str());
    std::abort();
  }

  void note(std::string s) {
    log_.push_back(std::move(s));
    if (log_.size() > 40) log_.pop_front();
  }

  void expect_code(const devrt::error& e, std::initializer_list<errc> allowed, const std::string& what) {
    for (errc c : allowed) {
      if (e.code == c) {
        if (e.message().empty()) fail(what + ": an error without a message");
        return;
      }
    }
    fail(what + ": unexpected error " + e.message());
  }

  std::size_t pick(std::size_t n) { return in_.ConsumeIntegralInRange<std::size_t>(0, n - 1); }

  /// Holds a handle of a descriptor that is new to the program (its model replaces any left from a
  /// recycled descriptor at the same address).
  void add_new(memory_handle h, model md) {
    models_.insert_or_assign(h.raw(), md);
    hold(std::move(h));
  }
  /// Holds one more handle of a descriptor the program already holds.
  void add_copy(memory_handle h) { hold(std::move(h)); }
  void hold(memory_handle h) {
    if (handles_.size() >= 48) {
      // The oldest goes; its model stays until prune() sees nothing refers to it.
      handles_.erase(handles_.begin());
    }
    handles_.push_back(std::move(h));
  }

  /// Forgets the models of descriptors the program no longer refers to.
  void prune() {
    std::unordered_set<const descriptor*> held;
    for (const auto& h : handles_) held.insert(h.raw());
    for (const auto& b : bindings_) held.insert(b.raw());
    for (auto it = models_.begin(); it != models_.end();) {
      it = held.count(it->first) != 0 ? std::next(it) : models_.erase(it);
    }
  }

  void mark_stale(const descriptor* d) { models_.at(d).s = state::stale; }

  void reserve_one() {
    const std::uint64_t size = size_choice(in_, props_);
    note("reserve(" + std::to_string(size) + ")");
    auto r = m_->reserve(size);
    if (!r) {
      expect_code(r.err(), {errc::buffer_too_big, errc::pool_capacity_exceeded, errc::out_of_memory}, "reserve");
      if (r.code() == errc::buffer_too_big && r.err().size != size) fail("buffer_too_big does not carry the size");
      // The bytes the device held when it refused: an arena that mapped part of the request before the
      // refusal gives that part back, so the device may hold less afterwards, never more.
      if (r.code() == errc::out_of_memory && r.err().in_use < sim_->allocated_bytes()) {
        fail("out_of_memory carries fewer bytes (" + std::to_string(r.err().in_use) + ") than the device holds (" +
             std::to_string(sim_->allocated_bytes()) + "): " + r.err().message());
      }
      return;
    }
    if (mode_ == mem::allocation_mode::persistent && r->raw()->loc.pool != mem::location::persistent_pool) {
      fail("a reserve in persistent mode was not served by the persistent pool");
    }
    add_new(std::move(*r), model{state::live, size, 0});
  }

  /// Runs one operation; true when it may have changed where memory lives (every reference is
  /// then resolved again).
  bool op() {
    const int choice = in_.ConsumeIntegralInRange<int>(0, 24);
    const bool moves = choice == 11 || choice == 12 || choice == 14 || choice == 16 || choice == 18;
    switch (choice) {
      case 0:
      case 1:
      case 2:
      case 3: reserve_one(); break;
      case 4: {
        const int n = in_.ConsumeIntegralInRange<int>(1, 12);
        for (int i = 0; i < n; ++i) reserve_one();
        break;
      }
      case 5:
      case 6:
        if (!handles_.empty()) {
          note("drop handle");
          handles_.erase(handles_.begin() + static_cast<std::ptrdiff_t>(pick(handles_.size())));
        }
        break;
      case 7:
        if (!handles_.empty()) {
          note("copy handle");
          memory_handle copy = handles_[pick(handles_.size())];
          add_copy(std::move(copy));
        }
        break;
      case 8:
        if (!handles_.empty()) {
          note("binding");
          if (bindings_.size() >= 32) bindings_.erase(bindings_.begin());
          bindings_.push_back(handles_[pick(handles_.size())].binding());
        }
        break;
      case 9:
        if (!bindings_.empty()) {
          note("drop binding");
          bindings_.erase(bindings_.begin() + static_cast<std::ptrdiff_t>(pick(bindings_.size())));
        }
        break;
      case 10:
        note("make unbound handle");
        add_new(memory_handle::make(), model{state::unbound, 0, 0});
        break;
      case 11: bind_to_fresh(); break;
      case 12: bind_to_existing(); break;
      case 13: view(); break;
      case 14: {
        const bool explicit_cleanup = in_.ConsumeBool();
        note(explicit_cleanup ? "cleanup(true)" : "cleanup(false)");
        if (auto r = m_->cleanup(explicit_cleanup); !r) expect_code(r.err(), {errc::device_error}, "cleanup");
        break;
      }
      case 15:
        note("flush");
        if (auto r = m_->flush(); !r) expect_code(r.err(), {errc::device_error}, "flush");
        break;
      case 16: configure(); break;
      case 17:
        note("capture_begin");
        m_->capture_begin();
        if (!capturing_) restore_mode_ = mode_;
        capturing_ = true;
        mode_ = mem::allocation_mode::persistent;
        break;
      case 18: capture_end(); break;
      case 19: {
        const auto mode = in_.ConsumeBool() ? mem::allocation_mode::persistent : mem::allocation_mode::automatic;
        note(mode == mem::allocation_mode::persistent ? "mode(persistent)" : "mode(automatic)");
        m_->mode(mode);
        if (policy_ != mem::persistent_policy::disabled && policy_ != mem::persistent_policy::enforced) {
          (capturing_ ? restore_mode_ : mode_) = mode;
        }
        break;
      }
      case 20: {
        const std::uint64_t n = in_.ConsumeIntegralInRange<std::uint64_t>(1, 6);
        note("fail_allocation(" + std::to_string(n) + ")");
        sim_->fail_allocation(n);
        break;
      }
      case 21:
        note("fail_next_flush");
        sim_->fail_next_flush();
        break;
      case 22: {
        const std::uint64_t caps[] = {0, 2 * mib, 16 * mib, sim_->allocated_bytes(), sim_->allocated_bytes() + mib};
        const std::uint64_t cap = caps[pick(std::size(caps))];
        note("set_capacity(" + std::to_string(cap) + ")");
        sim_->set_capacity(cap);
        break;
      }
      case 23:
        note("drop everything");
        handles_.clear();
        bindings_.clear();
        break;
      default: cursor_of_bindings(); break;
    }
    prune();
    return moves;
  }

  void bind_to_fresh() {
    if (handles_.empty()) return;
    const std::size_t i = pick(handles_.size());
    const std::uint64_t cursor = in_.ConsumeIntegral<std::uint64_t>();
    note("bind(handle, fresh, " + std::to_string(cursor) + ")");
    const descriptor* old = handles_[i].raw();
    const model before = models_.at(old);
    memory_handle fresh = memory_handle::make();
    memory_handle reserved = handles_[i];  // bind consumes its argument
    auto r = m_->bind(std::move(reserved), fresh, cursor);
    if (before.s != state::live) {
      if (r) fail("bind of a " + std::string(before.s == state::stale ? "stale" : "never bound") + " handle succeeded");
      expect_code(r.err(), {errc::not_found}, "bind");
      return;
    }
    if (!r) fail("bind of a live handle to a fresh one failed: " + r.err().message());
    mark_stale(old);
    add_new(std::move(fresh), model{state::live, before.size, cursor});
  }

  void bind_to_existing() {
    if (handles_.size() < 2) return;
    const std::size_t i = pick(handles_.size());
    const std::size_t j = pick(handles_.size());
    note("bind(handle, existing handle)");
    const descriptor* dr = handles_[i].raw();
    const descriptor* da = handles_[j].raw();
    const model ri = models_.at(dr);
    const model aj = models_.at(da);
    memory_handle reserved = handles_[i];
    auto r = m_->bind(std::move(reserved), handles_[j], 0);
    if (dr == da || aj.s != state::unbound) {
      if (r) fail("bind to a handle that already has (or had) memory succeeded");
      expect_code(r.err(), {errc::already_bound}, "bind to a bound handle");
      return;
    }
    if (ri.s != state::live) {
      if (r) fail("bind of a handle without memory succeeded");
      expect_code(r.err(), {errc::not_found}, "bind");
      return;
    }
    if (!r) fail("bind of a live handle to an unbound one failed: " + r.err().message());
    mark_stale(dr);
    models_.at(da) = model{state::live, ri.size, 0};
  }

  void view() {
    if (handles_.empty()) return;
    const memory_handle& h = handles_[pick(handles_.size())];
    const model md = models_.at(h.raw());
    std::optional<std::uint64_t> start;
    std::optional<std::uint64_t> end;
    if (in_.ConsumeBool()) start = in_.ConsumeIntegralInRange<std::uint64_t>(0, md.size + 2);
    if (in_.ConsumeBool()) end = in_.ConsumeIntegralInRange<std::uint64_t>(0, md.size + 2);
    note("get_resource");
    auto r = m_->get_resource(h, start, end);
    if (md.s != state::live) {
      if (r) fail("a view of a handle without memory resolved");
      expect_code(r.err(), {errc::not_found}, "get_resource");
      return;
    }
    const std::uint64_t s = start.value_or(0);
    const std::uint64_t e = end.value_or(0);
    if (s > md.size || e > md.size - s) {
      if (r) fail("a view past the end resolved");
      expect_code(r.err(), {errc::invalid_argument}, "get_resource");
      return;
    }
    if (!r) fail("a view inside the allocation failed: " + r.err().message());
    if (r->size != md.size - s - e) fail("the view has the wrong size");
  }

  void configure() {
    const mem::memory_layout layout = layout_choice(in_);
    note("configure(" + mem::to_string(layout) + ")");
    auto resolved = mem::resolve_layout(layout, props_);
    auto r = m_->configure(layout);
    if (!resolved) {
      if (r) fail("configure accepted a layout resolve_layout refuses");
      if (r.code() != resolved.code()) fail("configure and resolve_layout disagree: " + r.err().message());
      return;
    }
    if (capturing_) {
      if (r) fail("configure succeeded during a capture");
      expect_code(r.err(), {errc::capture_active}, "configure during a capture");
      return;
    }
    if (!r) {
      expect_code(r.err(), {errc::device_error}, "configure");
      return;
    }
    if (r->applied) {
      if (m_->layout() != *resolved) fail("configure applied another layout");
    } else if (r->live_allocations == 0) {
      fail("configure kept the layout with no live allocation");
    }
  }

  void capture_end() {
    note("capture_end");
    auto r = m_->capture_end();
    if (!capturing_) {
      if (r) fail("capture_end without a window succeeded");
      expect_code(r.err(), {errc::no_capture}, "capture_end");
      return;
    }
    capturing_ = false;
    mode_ = restore_mode_;
    if (!r) fail("capture_end failed: " + r.err().message());
    for (auto& pin : *r) {
      if (pin.raw()->loc.pool != mem::location::persistent_pool) fail("a pin outside the persistent pool");
      auto it = models_.find(pin.raw());
      if (it != models_.end()) {
        if (it->second.s != state::live) fail("a pin of a handle that has no memory");
        add_copy(std::move(pin));
        continue;
      }
      // Memory freed inside the window, live again through the pin.
      auto st = m_->get_storage(pin);
      if (!st) fail("a pin does not resolve: " + st.err().message());
      auto cur = m_->get_cursor(pin);
      add_new(std::move(pin), model{state::live, st->size, cur ? *cur : 0});
    }
  }

  void cursor_of_bindings() {
    if (bindings_.empty()) return;
    note("get_cursor(binding)");
    const memory_binding& b = bindings_[pick(bindings_.size())];
    const model md = models_.at(b.raw());
    auto c = m_->get_cursor(b);
    if (md.s != state::live) {
      if (c) fail("the cursor of a binding without memory resolved");
      expect_code(c.err(), {errc::not_found}, "get_cursor");
    } else if (!c || *c != md.cursor) {
      fail("the cursor of a live binding is wrong");
    }
  }

  /// The checks after an operation; `deep` also resolves every handle and binding held.
  void check(const std::string& after, bool deep) {
    if (const std::string p = m_->check_invariants(); !p.empty()) fail("after " + after + ": " + p);
    if (m_->capturing() != capturing_) fail("after " + after + ": capturing() disagrees with the model");
    std::uint64_t live = 0;
    std::uint64_t bytes = 0;
    for (const auto& [d, md] : models_) {
      if (md.s != state::live) continue;
      ++live;
      bytes += md.size;
    }
    const mem::memory_usage u = m_->usage();
    if (u.number_allocs != live || u.bytes_in_use != bytes) {
      fail("after " + after + ": usage counts " + std::to_string(u.number_allocs) + " allocations of " +
           std::to_string(u.bytes_in_use) + " bytes, the program holds " + std::to_string(live) + " of " +
           std::to_string(bytes));
    }
    const auto& stats = m_->statistics();
    if (u.bytes_reserved != stats.bytes_reserved) fail("after " + after + ": usage and statistics disagree");
    if (sim_->misuses() != 0) fail("after " + after + ": the manager broke the device's mapping contract");
    if (sim_->pending_deallocations() == 0 ? sim_->allocated_bytes() != stats.bytes_reserved
                                           : sim_->allocated_bytes() < stats.bytes_reserved) {
      fail("after " + after + ": the device holds " + std::to_string(sim_->allocated_bytes()) +
           " bytes, the manager reports " + std::to_string(stats.bytes_reserved) + " reserved");
    }
    if (!deep) return;
    for (const auto& h : handles_) resolve(h, models_.at(h.raw()), after);
    for (const auto& b : bindings_) resolve(b, models_.at(b.raw()), after);
  }

  template <class Ref>
  void resolve(const Ref& ref, const model& md, const std::string& after) {
    auto s = m_->get_storage(ref);
    if (md.s != state::live) {
      if (s) fail("after " + after + ": a stale or unbound reference resolves");
      if (s.code() != errc::not_found) fail("after " + after + ": " + s.err().message());
      return;
    }
    if (!s) fail("after " + after + ": a live reference does not resolve: " + s.err().message());
    if (s->size != md.size) fail("after " + after + ": a live reference has the wrong size");
    auto c = m_->get_cursor(ref);
    if (!c || *c != md.cursor) fail("after " + after + ": a live reference has the wrong cursor");
  }

  void finish() {
    note("finish");
    if (capturing_) capture_end();
    handles_.clear();
    bindings_.clear();
    prune();
    auto r = m_->cleanup(true);
    if (!r) {
      expect_code(r.err(), {errc::device_error}, "final cleanup");
      if (auto f = m_->flush(); !f) fail("the flush after a failed one failed: " + f.err().message());
    }
    check("final cleanup", true);
    const mem::memory_usage u = m_->usage();
    if (u.number_allocs != 0 || u.bytes_in_use != 0 || u.bytes_reserved != 0) {
      fail("memory left after dropping everything and an explicit cleanup:\n" + m_->report());
    }
    if (sim_->allocated_bytes() != 0 || sim_->mapped_bytes() != 0 || sim_->page_count() != 0 ||
        sim_->pending_deallocations() != 0) {
      fail("the device still holds " + std::to_string(sim_->allocated_bytes()) + " bytes in " +
           std::to_string(sim_->page_count()) + " pages");
    }
  }

  FuzzedDataProvider& in_;
  mem::device_properties props_;
  mem::persistent_policy policy_ = mem::persistent_policy::enabled;
  std::unique_ptr<mem::memory_manager> m_;
  devrt::devices::sim_storage* sim_ = nullptr;
  std::vector<memory_handle> handles_;
  std::vector<memory_binding> bindings_;
  std::unordered_map<const descriptor*, model> models_;
  bool capturing_ = false;
  mem::allocation_mode mode_ = mem::allocation_mode::automatic;
  mem::allocation_mode restore_mode_ = mem::allocation_mode::automatic;
  std::deque<std::string> log_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  program p(in);
  p.run();
  return 0;
}
