// Seeded randomized test of the memory manager against a simple model.
//
// A long run of mixed operations (reserve, copy, drop, bindings, bind, cleanup, configure,
// capture windows, mode changes) on a manager over sim storage, and a shorter one over host
// storage that also writes a byte pattern into every allocation and checks it before the memory
// is given up. After every step: check_invariants() is empty, usage() matches the model,
// deallocations_queued() agrees with the storage, and every live handle and binding resolves to
// its allocation; every ~100 steps: no two live allocations overlap, stale references resolve to
// not_found, and (host) every pattern is intact.
//
// Reproduce a failure with the seed printed in its message:
//   DEVRT_RANDOM_SEED=<seed> DEVRT_RANDOM_OPS=<n> devrt_memory_tests --gtest_filter='Randomized*'

#include <gtest/gtest.h>

#include <fmt/format.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "devrt/devices/host_storage.hpp"
#include "devrt/devices/sim_storage.hpp"
#include "devrt/memory/memory_manager.hpp"

namespace {

using devrt::errc;
using devrt::memory::allocation_mode;
using devrt::memory::arena_pool_config;
using devrt::memory::exclusive_pool_config;
using devrt::memory::location;
using devrt::memory::manager_options;
using devrt::memory::memory_binding;
using devrt::memory::memory_handle;
using devrt::memory::memory_layout;
using devrt::memory::memory_manager;
using devrt::memory::pool_config;
using devrt::memory::pool_kind;
using devrt::memory::pool_options;
using devrt::memory::preset;
using devrt::memory::sliced_pool_config;
using devrt::memory::storage;
using devrt::memory::storage_handle;
using devrt::memory::storage_id;

constexpr std::uint64_t kib = 1024;
constexpr std::uint64_t mib = 1024 * kib;

std::uint64_t env_or(const char* name, std::uint64_t fallback) {
  const char* v = std::getenv(name);  // NOLINT(concurrency-mt-unsafe): read before any thread starts
  if (v == nullptr || *v == '\0') return fallback;
  return std::strtoull(v, nullptr, 10);
}

std::uint64_t splitmix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// The allocation holds `word` repeated (period 8 bytes, the tail cut short).
void fill_pattern(void* p, std::uint64_t n, std::uint64_t word) {
  auto* b = static_cast<unsigned char*>(p);
  const std::uint64_t first = std::min<std::uint64_t>(n, 8);
  std::memcpy(b, &word, first);
  std::uint64_t done = first;
  while (done < n) {
    const std::uint64_t k = std::min(done, n - done);
    std::memcpy(b + done, b, k);
    done += k;
  }
}

bool pattern_intact(const void* p, std::uint64_t n, std::uint64_t word) {
  const auto* b = static_cast<const unsigned char*>(p);
  const std::uint64_t first = std::min<std::uint64_t>(n, 8);
  if (std::memcmp(b, &word, first) != 0) return false;
  return n <= 8 || std::memcmp(b, b + 8, n - 8) == 0;
}

struct run_config {
  bool host = false;  // host storage: check data integrity
  std::uint64_t ops = 0;
  std::uint64_t seed = 0;
  std::uint64_t max_page = 0;   // device max page size
  std::uint64_t large_max = 0;  // largest "large" request (besides too-big probes)
  std::size_t target_live = 0;  // population the drop rate steers toward
};

// One allocation of the model: an identity with its size and where it lives.
struct model_alloc {
  std::uint64_t size = 0;
  bool persistent = false;
  std::uint64_t pattern = 0;
  std::uint64_t id = 0;  // current identity (changes on bind)
  storage_handle where;  // page, offset, size: fixed for the allocation's life
  int handles = 0;       // user handles held by the model (pins included)
  int bindings = 0;
};

struct op_counts {
  std::map<std::string, std::uint64_t> n;
  void add(const std::string& k) { ++n[k]; }
  std::uint64_t operator[](const std::string& k) const {
    auto it = n.find(k);
    return it == n.end() ? 0 : it->second;
  }
};

class harness {
 public:
  harness(memory_manager& m, const run_config& cfg) : m_(m), cfg_(cfg), rng_(cfg.seed) { refresh_layout(); }

  // Runs every step; returns the first failure, or "".
  std::string run() {
    for (step_ = 0; step_ < cfg_.ops; ++step_) {
      std::string e = step();
      if (e.empty()) e = check_step();
      if (e.empty() && step_ % 100 == 99) e = check_deep();
      if (!e.empty()) {
        return fmt::format("step {} (op {}), seed {}: {}\nlive: {} allocations, {} handles, {} bindings\n{}", step_,
                           op_, cfg_.seed, e, allocs_.size(), handles_.size(), bindings_.size(), m_.report());
      }
    }
    // Drop everything: the manager must come back to zero.
    if (capturing_) {
      auto pins = m_.capture_end();
      if (!pins) return "final capture_end failed: " + pins.err().message();
    }
    for (auto& [h, k] : handles_) {
      if (std::string e = verify(k); !e.empty()) return e;
    }
    handles_.clear();
    bindings_.clear();
    stale_handles_.clear();
    stale_bindings_.clear();
    allocs_.clear();
    by_id_.clear();
    bytes_ = 0;
    const auto u = m_.usage();
    if (u.number_allocs != 0 || u.bytes_in_use != 0) {
      return fmt::format("after dropping everything: {} allocations, {} bytes in use", u.number_allocs, u.bytes_in_use);
    }
    if (auto c = m_.cleanup(true); !c) return "final cleanup failed: " + c.err().message();
    if (std::string e = m_.check_invariants(); !e.empty()) return "final check_invariants: " + e;
    if (m_.usage().bytes_reserved != 0) {
      return fmt::format("an explicit cleanup with nothing live kept {} bytes", m_.usage().bytes_reserved);
    }
    return {};
  }

  const op_counts& counts() const { return counts_; }
  std::size_t peak_live() const { return peak_live_; }

 private:
  // ---- random helpers ----
  std::uint64_t uniform(std::uint64_t lo, std::uint64_t hi) {  // inclusive
    return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng_);
  }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  std::uint64_t log_uniform(std::uint64_t lo, std::uint64_t hi) {
    const double a = std::log(static_cast<double>(lo));
    const double b = std::log(static_cast<double>(hi));
    const auto v = static_cast<std::uint64_t>(std::exp(std::uniform_real_distribution<double>(a, b)(rng_)));
    return std::clamp(v, lo, hi);
  }

  bool persistent_now() const { return capturing_ || mode_ == allocation_mode::persistent; }

  std::uint64_t random_size() {
    const std::uint64_t r = uniform(0, 99);
    if (r < 5) return 0;
    if (r < 40) return uniform(1, 256);
    if (r < 75) return uniform(257, 256 * kib);
    if (r < 95) return log_uniform(256 * kib, std::max(256 * kib, std::min(cfg_.large_max, largest_)));
    // Around and past the largest pool.
    if (cfg_.host && persistent_now()) return uniform(257, 64 * kib);  // would really be allocated
    switch (uniform(0, 3)) {
      case 0: return largest_;
      case 1: return largest_ + 1;
      default: return uniform(largest_ + 1, 2 * largest_);
    }
  }

  // ---- layouts ----
  void refresh_layout() {
    largest_ = 0;
    capped_ = false;
    arena_ = false;
    for (const pool_options& o : m_.layout()) {
      if (o.kind == pool_kind::arena) {
        // An arena takes up to its max, within its address space; a full address space is an
        // out-of-memory error.
        largest_ = std::max(largest_, std::min(o.max_alloc_size, *o.max_pool_size));
        arena_ = true;
        capped_ = true;  // a full address space is pool_capacity_exceeded
        continue;
      }
      largest_ =
          std::max(largest_, o.kind == pool_kind::sliced ? std::max(o.page_size, o.max_alloc_size) : o.max_alloc_size);
      capped_ = capped_ || o.max_pool_size.has_value();
    }
  }

  std::uint64_t random_page() {
    static constexpr std::uint64_t pages[] = {4 * kib, 64 * kib, 1 * mib, 4 * mib, 16 * mib, 64 * mib};
    const std::size_t n = cfg_.host ? 5 : 6;  // host: no 64 MiB pages
    std::uint64_t p = pages[uniform(0, n - 1)];
    if (chance(0.3)) p += uniform(1, 100);  // rounded up to the alignment by the layout
    return p;
  }
  std::optional<std::uint64_t> random_period() {
    if (chance(0.5)) return std::nullopt;
    return uniform(1, 300);
  }

  // A valid explicit layout whose last pool is the largest and accepts every size up to it, so an
  // uncapped layout serves every size up to the largest pool.
  memory_layout random_explicit_layout() {
    const std::uint64_t align = m_.properties().alignment;
    std::vector<pool_config> pools;
    const std::uint64_t n = uniform(0, 3);
    std::uint64_t top = 0;
    for (std::uint64_t i = 0; i < n; ++i) {
      if (chance(0.6)) {
        sliced_pool_config s;
        s.page_size = random_page();
        const std::uint64_t page = devrt::memory::align_up(s.page_size, align);
        if (chance(0.6)) s.max_slice_size = uniform(1, page);
        if (chance(0.4)) s.max_pool_size = page * uniform(1, 6) + uniform(0, page - 1);
        s.dealloc_period = random_period();
        top = std::max(top, page);
        pools.emplace_back(s);
      } else {
        exclusive_pool_config x;
        x.max_alloc_size = chance(0.2) ? 0 : log_uniform(1, 8 * mib);
        x.dealloc_period = random_period();
        top = std::max(top, devrt::memory::align_up(x.max_alloc_size, align));
        pools.emplace_back(x);
      }
    }
    std::uint64_t last = random_page();
    while (devrt::memory::align_up(last, align) < top) last *= 2;
    const std::uint64_t granularity = m_.properties().map_granularity;
    if (granularity != 0 && chance(0.4)) {
      // An arena last: small address spaces so that filling them is part of the run.
      arena_pool_config a;
      const std::uint64_t granule = granularity * uniform(1, 3);
      if (chance(0.5)) a.granule = granule;
      const std::uint64_t fewest = std::max<std::uint64_t>(8, 2 * last / granule + 2);
      const std::uint64_t space = granule * uniform(fewest, std::max<std::uint64_t>(fewest, 256));
      a.address_space = space;
      if (chance(0.3)) a.max_alloc_size = std::max(last, uniform(1, space / 2));
      if (chance(0.5)) a.slack = uniform(0, 6) * granularity;
      pools.emplace_back(a);
      return memory_layout(std::move(pools));
    }
    if (chance(0.6)) {
      sliced_pool_config s;
      s.page_size = last;
      const std::uint64_t page = devrt::memory::align_up(last, align);
      if (chance(0.4)) s.max_pool_size = page * uniform(1, 4) + uniform(0, page - 1);
      s.dealloc_period = random_period();
      pools.emplace_back(s);
    } else {
      exclusive_pool_config x;
      x.max_alloc_size = last;
      x.dealloc_period = random_period();
      pools.emplace_back(x);
    }
    return memory_layout(std::move(pools));
  }

  memory_layout random_layout() {
    const std::uint64_t r = uniform(0, 9);
    if (r < 3) return preset::sub_slices;
    if (r < 5) return preset::exclusive_pages;
    return random_explicit_layout();
  }

  // ---- model bookkeeping ----
  model_alloc* live(std::uint64_t key) {
    auto it = allocs_.find(key);
    return it == allocs_.end() ? nullptr : &it->second;
  }

  std::string new_allocation(memory_handle h, bool persistent, std::uint64_t expect_size, bool write) {
    const std::uint64_t id = h.id().value;
    if (id == 0) return "a successful reserve returned an empty handle";
    if (!seen_ids_.insert(id).second) return fmt::format("id {} was given to a second allocation", id);
    auto st = m_.get_storage(h);
    if (!st) return "a new allocation does not resolve: " + st.err().message();
    if (st->size != expect_size)
      return fmt::format("a new allocation of {} bytes resolves to {}", expect_size, st->size);
    const bool in_persistent = h.raw()->loc.pool == location::persistent_pool;
    if (in_persistent != persistent) {
      return fmt::format("an allocation of {} bytes went to the {} pool, expected the {} pool", expect_size,
                         in_persistent ? "persistent" : "dynamic", persistent ? "persistent" : "dynamic");
    }
    if (!h.can_mut() || h.use_count() != 1) return "a new allocation's handle is not unique";
    model_alloc a;
    a.size = expect_size;
    a.persistent = persistent;
    a.pattern = splitmix(id);
    a.id = id;
    a.where = *st;
    a.handles = 1;
    if (cfg_.host && write) {
      auto r = m_.get_resource(h);
      if (!r) return "a new host allocation has no resource: " + r.err().message();
      if (r->size != expect_size || (r->ptr == nullptr && expect_size > 0)) return "bad host resource";
      if (expect_size > 0) fill_pattern(r->ptr, expect_size, a.pattern);
    }
    const std::uint64_t key = next_key_++;
    allocs_.emplace(key, a);
    by_id_[id] = key;
    bytes_ += expect_size;
    handles_.emplace_back(std::move(h), key);
    if (capturing_ && persistent) touched_.insert(a.where.id);
    peak_live_ = std::max(peak_live_, allocs_.size());
    return {};
  }

  // Host: the allocation still holds its pattern.
  template <class Ref>
  std::string verify_through(const Ref& ref, std::uint64_t key) {
    if (!cfg_.host) return {};
    const model_alloc& a = allocs_.at(key);
    if (a.size == 0) return {};
    auto r = m_.get_resource(ref);
    if (!r) return "a live allocation has no resource: " + r.err().message();
    if (!pattern_intact(r->ptr, a.size, a.pattern)) {
      return fmt::format("the data of allocation id {} ({} bytes at page {} offset {}) was overwritten", a.id, a.size,
                         a.where.id, a.where.offset);
    }
    return {};
  }
  std::string verify(std::uint64_t key) {
    for (auto& [h, k] : handles_) {
      if (k == key) return verify_through(h, key);
    }
    for (auto& [b, k] : bindings_) {
      if (k == key) return verify_through(b, key);
    }
    return "model: no reference to a live allocation";
  }

  // A reference of `key` is about to go: when it is the last one, check the data and forget it.
  template <class Ref>
  std::string before_last_drop(const Ref& ref, std::uint64_t key, bool is_handle) {
    model_alloc& a = allocs_.at(key);
    if (is_handle) {
      --a.handles;
    } else {
      --a.bindings;
    }
    if (a.handles + a.bindings > 0) return {};
    if (std::string e = verify_through(ref, key); !e.empty()) return e;
    bytes_ -= a.size;
    by_id_.erase(a.id);
    allocs_.erase(key);
    return {};
  }

  template <class T>
  static void remove_at(std::vector<T>& v, std::size_t i) {
    if (i + 1 != v.size()) v[i] = std::move(v.back());
    v.pop_back();
  }

  // ---- operations ----
  std::string op_reserve() {
    const std::uint64_t size = random_size();
    const bool persistent = persistent_now();
    auto r = m_.reserve(size);
    if (r) {
      counts_.add(persistent ? "reserve ok (persistent)" : "reserve ok");
      if (!persistent && size > largest_)
        return fmt::format("reserve({}) succeeded past the largest pool {}", size, largest_);
      return new_allocation(std::move(*r), persistent, size, true);
    }
    const errc c = r.code();
    if (persistent) return fmt::format("persistent reserve({}) failed: {}", size, r.err().message());
    if (r.err().size != size) return fmt::format("reserve({}) error names size {}", size, r.err().size);
    if (size > largest_) {
      if (c != errc::buffer_too_big)
        return fmt::format("reserve({}) past the largest pool {}: {}", size, largest_, r.err().message());
      counts_.add("reserve buffer_too_big");
      return {};
    }
    if (c == errc::pool_capacity_exceeded && capped_) {
      counts_.add("reserve pool_capacity_exceeded");
      return {};
    }
    return fmt::format("reserve({}) failed with {} ({}); largest pool {}, layout {}", size, devrt::to_string(c),
                       r.err().message(), largest_, capped_ ? "capped" : "uncapped");
  }

  std::string op_drop_handle() {
    if (handles_.empty()) return {};
    const std::size_t i = uniform(0, handles_.size() - 1);
    const std::uint64_t key = handles_[i].second;
    const model_alloc& a = allocs_.at(key);
    if (handles_[i].first.can_mut() != (a.handles == 1)) {
      return fmt::format("can_mut is {} with {} handles", handles_[i].first.can_mut(), a.handles);
    }
    if (std::string e = before_last_drop(handles_[i].first, key, true); !e.empty()) return e;
    remove_at(handles_, i);
    counts_.add("drop handle");
    return {};
  }

  std::string op_copy_handle() {
    if (handles_.empty()) return {};
    const std::size_t i = uniform(0, handles_.size() - 1);
    const std::uint64_t key = handles_[i].second;
    model_alloc& a = allocs_.at(key);
    memory_handle copy = handles_[i].first;
    ++a.handles;
    if (copy.can_mut() || handles_[i].first.can_mut()) return "can_mut is true while the handle is copied";
    if (copy.use_count() != static_cast<std::uint64_t>(a.handles)) {
      return fmt::format("use_count {} but the model holds {} handles", copy.use_count(), a.handles);
    }
    if (copy.id().value != a.id) return "a copy has another id";
    handles_.emplace_back(std::move(copy), key);
    counts_.add("copy handle");
    return {};
  }

  std::string op_binding_then_drop_handle() {
    if (handles_.empty()) return {};
    const std::size_t i = uniform(0, handles_.size() - 1);
    const std::uint64_t key = handles_[i].second;
    model_alloc& a = allocs_.at(key);
    const auto before = m_.usage();
    memory_binding b;
    if (chance(0.5)) {
      b = std::move(handles_[i].first).binding();
      if (!handles_[i].first.empty()) return "binding() && left the handle non-empty";
    } else {
      b = handles_[i].first.binding();
      handles_[i].first.reset();
    }
    remove_at(handles_, i);
    --a.handles;
    ++a.bindings;
    if (b.id().value != a.id) return "a binding has another id";
    const auto after = m_.usage();
    if (after.number_allocs != before.number_allocs || after.bytes_in_use != before.bytes_in_use) {
      return "dropping a handle whose memory has a binding changed the usage";
    }
    bindings_.emplace_back(std::move(b), key);
    counts_.add("binding then drop handle");
    return {};
  }

  std::string op_drop_binding() {
    if (bindings_.empty()) return {};
    const std::size_t i = uniform(0, bindings_.size() - 1);
    const std::uint64_t key = bindings_[i].second;
    if (std::string e = before_last_drop(bindings_[i].first, key, false); !e.empty()) return e;
    remove_at(bindings_, i);
    counts_.add("drop binding");
    return {};
  }

  std::string op_bind() {
    if (handles_.empty()) return {};
    const std::size_t i = uniform(0, handles_.size() - 1);
    const std::uint64_t key = handles_[i].second;
    model_alloc& a = allocs_.at(key);
    if (chance(0.1)) {
      // Binding to a handle that has memory is refused and changes nothing.
      const std::size_t j = uniform(0, handles_.size() - 1);
      auto r = m_.bind(handles_[i].first, handles_[j].first);
      if (r.code() != errc::already_bound) return fmt::format("bind to a live handle: {}", devrt::to_string(r.code()));
      counts_.add("bind already_bound");
      return {};
    }
    memory_handle assigned = memory_handle::make();
    const std::uint64_t cursor = uniform(0, 1000);
    const bool by_move = chance(0.3);
    memory_handle reserved = by_move ? std::move(handles_[i].first) : handles_[i].first;
    if (by_move) {
      remove_at(handles_, i);
      --a.handles;
    }
    auto r = m_.bind(std::move(reserved), assigned, cursor);
    if (!r) return "bind failed: " + r.err().message();
    // Every old reference is stale now.
    for (std::size_t k = handles_.size(); k-- > 0;) {
      if (handles_[k].second == key) {
        stale_handles_.push_back(std::move(handles_[k].first));
        remove_at(handles_, k);
      }
    }
    for (std::size_t k = bindings_.size(); k-- > 0;) {
      if (bindings_[k].second == key) {
        stale_bindings_.push_back(std::move(bindings_[k].first));
        remove_at(bindings_, k);
      }
    }
    by_id_.erase(a.id);
    a.id = assigned.id().value;
    if (!seen_ids_.insert(a.id).second) return "make() gave an id already seen";
    by_id_[a.id] = key;
    a.handles = 1;
    a.bindings = 0;
    auto st = m_.get_storage(assigned);
    if (!st) return "the assigned handle does not resolve: " + st.err().message();
    if (!(*st == a.where)) return "bind moved the memory";
    auto cur = m_.get_cursor(assigned);
    if (!cur || *cur != cursor) return "bind lost the cursor";
    if (!stale_handles_.empty() && m_.get_storage(stale_handles_.back()).code() != errc::not_found) {
      return "a copy of the reserved handle still resolves after bind";
    }
    if (capturing_ && a.persistent) touched_.insert(a.where.id);
    handles_.emplace_back(std::move(assigned), key);
    if (std::string e = verify(key); !e.empty()) return "after bind: " + e;
    counts_.add("bind");
    return {};
  }

  std::string op_drop_stale() {
    if (!stale_handles_.empty() && chance(0.5)) {
      const std::size_t i = uniform(0, stale_handles_.size() - 1);
      if (m_.get_storage(stale_handles_[i]).code() != errc::not_found) return "a stale handle resolves";
      remove_at(stale_handles_, i);
    } else if (!stale_bindings_.empty()) {
      const std::size_t i = uniform(0, stale_bindings_.size() - 1);
      if (m_.get_storage(stale_bindings_[i]).code() != errc::not_found) return "a stale binding resolves";
      remove_at(stale_bindings_, i);
    }
    counts_.add("drop stale");
    return {};
  }

  std::string op_cleanup() {
    const bool full = chance(0.4);
    auto r = m_.cleanup(full);
    if (!r) return "cleanup failed: " + r.err().message();
    counts_.add(full ? "cleanup(true)" : "cleanup(false)");
    return {};
  }

  std::string op_configure() {
    const memory_layout layout = random_layout();
    std::uint64_t dynamic_live = 0;
    std::uint64_t dynamic_bytes = 0;
    for (const auto& [k, a] : allocs_) {
      if (!a.persistent) {
        ++dynamic_live;
        dynamic_bytes += a.size;
      }
    }
    auto expected = devrt::memory::resolve_layout(layout, m_.properties());
    if (!expected) return "the test made an invalid layout: " + expected.err().message();
    const auto old_layout = m_.layout();
    auto r = m_.configure(layout);
    if (capturing_) {
      if (r.code() != errc::capture_active) return "configure during a capture did not return capture_active";
      counts_.add("configure capture_active");
      return {};
    }
    if (!r) return "configure failed: " + r.err().message();
    const bool expect_applied = dynamic_live == 0;
    if (r->applied != expect_applied) {
      return fmt::format("configure applied={} with {} live dynamic allocations ({} bytes)", r->applied, dynamic_live,
                         dynamic_bytes);
    }
    if (r->applied) {
      if (m_.layout() != *expected) return "the applied layout is not the resolved layout";
      counts_.add("configure applied");
    } else {
      if (r->live_allocations != dynamic_live) {
        return fmt::format("configure kept the layout with live_allocations {}, the model has {}", r->live_allocations,
                           dynamic_live);
      }
      if (r->live_bytes != dynamic_bytes) {
        return fmt::format("configure kept the layout with live_bytes {}, the model has {}", r->live_bytes,
                           dynamic_bytes);
      }
      if (m_.layout() != old_layout) return "a configure that was not applied changed the layout";
      counts_.add("configure kept");
    }
    refresh_layout();
    return {};
  }

  std::string op_capture_begin() {
    if (!capturing_) {
      restore_mode_ = mode_;
      touched_.clear();
    }
    capturing_ = true;
    m_.capture_begin();
    if (!m_.capturing()) return "capture_begin did not open a window";
    counts_.add("capture_begin");
    return {};
  }

  std::string op_capture_end() {
    auto r = m_.capture_end();
    if (!capturing_) {
      if (r.code() != errc::no_capture) return "capture_end without a window did not return no_capture";
      counts_.add("capture_end no_capture");
      return {};
    }
    capturing_ = false;
    mode_ = restore_mode_;
    if (!r) return "capture_end failed: " + r.err().message();
    if (m_.capturing()) return "the window is still open after capture_end";
    std::vector<memory_handle> pins = std::move(*r);
    if (pins.size() != touched_.size()) {
      return fmt::format("capture_end returned {} pins, the window touched {} persistent slices", pins.size(),
                         touched_.size());
    }
    std::set<storage_id> pinned;
    for (auto& p : pins) {
      auto st = m_.get_storage(p);
      if (!st) return "a pin does not resolve: " + st.err().message();
      if (touched_.count(st->id) == 0) return "a pin holds a slice the window did not touch";
      if (!pinned.insert(st->id).second) return "two pins for one slice";
      if (p.raw()->loc.pool != location::persistent_pool) return "a pin is not persistent";
      auto it = by_id_.find(p.id().value);
      if (it != by_id_.end()) {
        model_alloc& a = allocs_.at(it->second);
        if (!(a.where == *st)) return "a pin of a live allocation resolves elsewhere";
        ++a.handles;
        handles_.emplace_back(std::move(p), it->second);
      } else {
        // Freed inside the window: live again under a fresh identity.
        if (std::string e = new_allocation(std::move(p), true, st->size, true); !e.empty()) return "pin: " + e;
        counts_.add("pin of a freed slice");
      }
    }
    counts_.add("capture_end");
    return {};
  }

  std::string op_mode() {
    const allocation_mode want = chance(0.35) ? allocation_mode::persistent : allocation_mode::automatic;
    m_.mode(want);
    if (capturing_) {
      restore_mode_ = want;
    } else {
      mode_ = want;
    }
    counts_.add("mode");
    return {};
  }

  // Drops every reference, or (keep_zero_size) every reference to an allocation of nonzero size:
  // the next configure then sees no live bytes but, possibly, live zero-size allocations.
  std::string op_drop_all(bool keep_zero_size) {
    for (std::size_t i = handles_.size(); i-- > 0;) {
      const std::uint64_t key = handles_[i].second;
      if (keep_zero_size && allocs_.at(key).size == 0) continue;
      if (std::string e = before_last_drop(handles_[i].first, key, true); !e.empty()) return e;
      remove_at(handles_, i);
    }
    for (std::size_t i = bindings_.size(); i-- > 0;) {
      const std::uint64_t key = bindings_[i].second;
      if (keep_zero_size && allocs_.at(key).size == 0) continue;
      if (std::string e = before_last_drop(bindings_[i].first, key, false); !e.empty()) return e;
      remove_at(bindings_, i);
    }
    counts_.add(keep_zero_size ? "drop all but zero-size" : "drop all");
    return {};
  }

  std::string step() {
    // Weights: reserve, drop handle, copy, binding+drop, drop binding, bind, drop stale, cleanup,
    // configure, capture_begin, capture_end, mode, drop all, drop all but zero-size.
    const double pop = static_cast<double>(handles_.size() + bindings_.size());
    const double pressure = pop / static_cast<double>(cfg_.target_live);
    const double w[] = {30.0,
                        22.0 * pressure,
                        8.0,
                        6.0,
                        10.0 * pressure,
                        5.0,
                        stale_handles_.empty() && stale_bindings_.empty() ? 0.0 : 4.0,
                        2.0,
                        1.5,
                        capturing_ ? 0.2 : 0.5,
                        capturing_ ? 2.0 : 0.2,
                        1.0,
                        0.1,
                        0.1};
    std::discrete_distribution<int> pick(std::begin(w), std::end(w));
    switch (pick(rng_)) {
      case 0: op_ = "reserve"; return op_reserve();
      case 1: op_ = "drop handle"; return op_drop_handle();
      case 2: op_ = "copy handle"; return op_copy_handle();
      case 3: op_ = "binding then drop handle"; return op_binding_then_drop_handle();
      case 4: op_ = "drop binding"; return op_drop_binding();
      case 5: op_ = "bind"; return op_bind();
      case 6: op_ = "drop stale"; return op_drop_stale();
      case 7: op_ = "cleanup"; return op_cleanup();
      case 8: op_ = "configure"; return op_configure();
      case 9: op_ = "capture_begin"; return op_capture_begin();
      case 10: op_ = "capture_end"; return op_capture_end();
      case 11: op_ = "mode"; return op_mode();
      case 12: {
        op_ = "drop all";
        std::string e = op_drop_all(false);
        // Then, often, a new layout: with nothing dynamic live it is applied.
        if (e.empty() && chance(0.7)) {
          op_ = "drop all, configure";
          e = op_configure();
        }
        return e;
      }
      default: {
        op_ = "drop all but zero-size";
        std::string e = op_drop_all(true);
        if (e.empty() && chance(0.7)) {
          op_ = "drop all but zero-size, configure";
          e = op_configure();
        }
        return e;
      }
    }
  }

  // ---- checks ----
  std::string check_step() {
    if (std::string e = m_.check_invariants(); !e.empty()) return "check_invariants: " + e;
    const auto u = m_.usage();
    if (u.number_allocs != allocs_.size()) {
      return fmt::format("usage counts {} allocations, the model {}", u.number_allocs, allocs_.size());
    }
    if (u.bytes_in_use != bytes_)
      return fmt::format("usage counts {} bytes in use, the model {}", u.bytes_in_use, bytes_);
    if (m_.statistics().bytes_in_use != bytes_) return "statistics().bytes_in_use differs from the model";
    // The flag the actor and the replay loop ask before a flush: every path that gives memory back
    // raises it, so it never says "nothing queued" while the storage holds deallocations.
    if (const std::size_t pending = m_.backing_storage().pending_deallocations();
        m_.deallocations_queued() != (pending != 0)) {
      return fmt::format("deallocations_queued() says {} with {} deallocations queued in the storage",
                         m_.deallocations_queued(), pending);
    }
    const allocation_mode expect_mode = capturing_ ? allocation_mode::persistent : mode_;
    if (m_.current_mode() != expect_mode || m_.capturing() != capturing_) return "mode or capture state differs";
    for (const auto& [h, k] : handles_) {
      auto st = m_.get_storage(h);
      const model_alloc& a = allocs_.at(k);
      if (!st)
        return fmt::format("a live handle (id {}, {} bytes) does not resolve: {}", a.id, a.size, st.err().message());
      if (!(*st == a.where)) {
        return fmt::format(
            "a live handle of {} bytes resolves to page {} offset {} size {}, expected page {} offset {}", a.size,
            st->id, st->offset, st->size, a.where.id, a.where.offset);
      }
    }
    for (const auto& [b, k] : bindings_) {
      auto st = m_.get_storage(b);
      const model_alloc& a = allocs_.at(k);
      if (!st) return fmt::format("a live binding (id {}) does not resolve: {}", a.id, st.err().message());
      if (!(*st == a.where)) return "a live binding resolves elsewhere";
    }
    return {};
  }

  std::string check_deep() {
    // No two live allocations overlap: [page, offset, offset + max(size, 1)).
    std::vector<std::pair<storage_handle, std::uint64_t>> ranges;
    ranges.reserve(allocs_.size());
    for (const auto& [k, a] : allocs_) ranges.emplace_back(a.where, a.id);
    std::sort(ranges.begin(), ranges.end(), [](const auto& x, const auto& y) {
      return x.first.id != y.first.id ? x.first.id < y.first.id : x.first.offset < y.first.offset;
    });
    for (std::size_t i = 1; i < ranges.size(); ++i) {
      const storage_handle& p = ranges[i - 1].first;
      const storage_handle& q = ranges[i].first;
      if (p.id == q.id && p.offset + std::max<std::uint64_t>(p.size, 1) > q.offset) {
        return fmt::format("allocations id {} [{}, +{}) and id {} [{}, +{}) overlap on page {}", ranges[i - 1].second,
                           p.offset, p.size, ranges[i].second, q.offset, q.size, p.id);
      }
    }
    for (const auto& h : stale_handles_) {
      if (m_.get_storage(h).code() != errc::not_found) return "a stale handle resolves";
    }
    for (const auto& b : stale_bindings_) {
      if (m_.get_storage(b).code() != errc::not_found) return "a stale binding resolves";
    }
    // Host: every pattern intact (the data of each allocation is also checked when it is given up).
    if (cfg_.host && step_ % 1000 == 999) {
      std::unordered_set<std::uint64_t> done;
      for (const auto& [h, k] : handles_) {
        if (!done.insert(k).second) continue;
        if (std::string e = verify_through(h, k); !e.empty()) return e;
      }
      for (const auto& [b, k] : bindings_) {
        if (!done.insert(k).second) continue;
        if (std::string e = verify_through(b, k); !e.empty()) return e;
      }
    }
    return {};
  }

  memory_manager& m_;
  run_config cfg_;
  std::mt19937_64 rng_;
  std::uint64_t step_ = 0;
  const char* op_ = "";

  std::unordered_map<std::uint64_t, model_alloc> allocs_;   // key -> live allocation
  std::unordered_map<std::uint64_t, std::uint64_t> by_id_;  // current id -> key
  std::vector<std::pair<memory_handle, std::uint64_t>> handles_;
  std::vector<std::pair<memory_binding, std::uint64_t>> bindings_;
  std::vector<memory_handle> stale_handles_;
  std::vector<memory_binding> stale_bindings_;
  std::unordered_set<std::uint64_t> seen_ids_;
  std::uint64_t next_key_ = 1;
  std::uint64_t bytes_ = 0;

  bool capturing_ = false;
  allocation_mode mode_ = allocation_mode::automatic;
  allocation_mode restore_mode_ = allocation_mode::automatic;
  std::set<storage_id> touched_;

  std::uint64_t largest_ = 0;
  bool arena_ = false;
  bool capped_ = false;

  op_counts counts_;
  std::size_t peak_live_ = 0;
};

void print_counts(const char* what, const op_counts& c, double seconds, std::size_t peak) {
  std::string line = fmt::format("{}: {:.2f} s, peak {} live allocations;", what, seconds, peak);
  for (const auto& [k, v] : c.n) line += fmt::format(" {}={}", k, v);
  std::printf("%s\n", line.c_str());
}

void expect_coverage(const op_counts& c) {
  // Each interesting path was taken at least once, so a passing run means something.
  for (const char* k : {"reserve ok",
                        "reserve ok (persistent)",
                        "reserve buffer_too_big",
                        "drop handle",
                        "copy handle",
                        "binding then drop handle",
                        "drop binding",
                        "bind",
                        "bind already_bound",
                        "drop stale",
                        "cleanup(true)",
                        "cleanup(false)",
                        "configure applied",
                        "configure kept",
                        "configure capture_active",
                        "capture_begin",
                        "capture_end",
                        "capture_end no_capture",
                        "pin of a freed slice",
                        "mode",
                        "drop all",
                        "drop all but zero-size"}) {
    EXPECT_GT(c[k], 0u) << "the run never took the path '" << k << "'";
  }
}

TEST(Randomized, SimStorageAgainstModel) {
  run_config cfg;
  cfg.host = false;
  cfg.ops = env_or("DEVRT_RANDOM_OPS", 100'000);
  cfg.seed = env_or("DEVRT_RANDOM_SEED", 0x5eed0001);
  cfg.max_page = 128ULL << 20;
  cfg.large_max = 128ULL << 20;
  cfg.target_live = 150;
  devrt::devices::sim_options o;
  o.props = {cfg.max_page, 32, 0, 1ULL << 20};
  manager_options mo;
  mo.layout = preset::sub_slices;
  memory_manager m(storage::make<devrt::devices::sim_storage>(o), mo);
  harness h(m, cfg);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string failure = h.run();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(failure, "");
  print_counts("sim", h.counts(), secs, h.peak_live());
  if (cfg.ops >= 50'000) {
    expect_coverage(h.counts());
    EXPECT_GT(h.counts()["reserve pool_capacity_exceeded"], 0u);
  }
}

TEST(Randomized, HostStorageWithDataIntegrity) {
  run_config cfg;
  cfg.host = true;
  cfg.ops = env_or("DEVRT_RANDOM_HOST_OPS", 20'000);
  cfg.seed = env_or("DEVRT_RANDOM_SEED", 0x5eed0002);
  cfg.max_page = 64ULL << 20;
  cfg.large_max = 4ULL << 20;
  cfg.target_live = 100;
  devrt::devices::host_options o;
  o.alignment = 64;
  o.max_page_size = cfg.max_page;
  manager_options mo;
  mo.layout = preset::sub_slices;
  memory_manager m(storage::make<devrt::devices::host_storage>(o), mo);
  harness h(m, cfg);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string failure = h.run();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(failure, "");
  print_counts("host", h.counts(), secs, h.peak_live());
  if (cfg.ops >= 10'000) expect_coverage(h.counts());
}

// Several seeds, shorter runs: different interleavings of the same operations.
TEST(Randomized, ManySeedsShort) {
  for (std::uint64_t seed = 1; seed <= 8; ++seed) {
    run_config cfg;
    cfg.ops = 3'000;
    cfg.seed = seed * 7919;
    cfg.max_page = 128ULL << 20;
    cfg.large_max = 128ULL << 20;
    cfg.target_live = 40;
    devrt::devices::sim_options o;
    o.props = {cfg.max_page, 32, 0, seed % 2 == 0 ? 1ULL << 20 : 0};
    manager_options mo;
    mo.layout = preset::sub_slices;
    memory_manager m(storage::make<devrt::devices::sim_storage>(o), mo);
    harness h(m, cfg);
    ASSERT_EQ(h.run(), "") << "seed " << cfg.seed;
  }
}

// Minimal form of a case the model checks: configure must keep the layout while a dynamic slice is
// live, even when that slice holds zero bytes (its handle must keep resolving).
TEST(RandomizedRegression, ConfigureKeepsLiveZeroSizeAllocations) {
  devrt::devices::sim_options o;
  o.props = {128ULL << 20, 32, 0};
  memory_manager m(storage::make<devrt::devices::sim_storage>(o), manager_options{});
  auto h = m.reserve(0);
  ASSERT_TRUE(h) << h.err().message();
  ASSERT_TRUE(m.get_storage(*h));
  auto r = m.configure(preset::exclusive_pages);
  ASSERT_TRUE(r) << r.err().message();
  EXPECT_FALSE(r->applied) << "configure replaced the pools under a live zero-size allocation";
  EXPECT_EQ(r->live_bytes, 0u);
  EXPECT_EQ(r->live_allocations, 1u);
  auto st = m.get_storage(*h);
  EXPECT_TRUE(st) << "the live zero-size allocation no longer resolves: " << (st ? "" : st.err().message());
  EXPECT_EQ(m.usage().number_allocs, 1u);
  EXPECT_EQ(m.check_invariants(), "");
}

}  // namespace
