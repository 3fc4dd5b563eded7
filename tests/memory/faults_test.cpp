// Fault injection on the memory core over sim storage: the device refuses the N-th allocation of a
// scripted workload (for every N the workload reaches: plain reserves, binds, a persistent scope,
// around reconfiguration, inside a capture window), a flush fails before each step, the capacity
// shrinks under live memory.
//
// After each fault: check_invariants() is empty, the device holds exactly the bytes the manager
// reports reserved, the caller got the error with the values that explain it (code, sizes, bytes
// held, capacity), and a retry after an explicit cleanup succeeds. Once everything is dropped and
// cleaned up, the device holds nothing.

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "devrt/devices/sim_storage.hpp"
#include "devrt/memory/memory_manager.hpp"

namespace {

using devrt::errc;
using devrt::devices::sim_options;
using devrt::devices::sim_storage;
using devrt::memory::allocation_mode;
using devrt::memory::exclusive_pool_config;
using devrt::memory::location;
using devrt::memory::manager_options;
using devrt::memory::memory_handle;
using devrt::memory::memory_layout;
using devrt::memory::memory_manager;
using devrt::memory::persistent_policy;
using devrt::memory::pool_config;
using devrt::memory::sliced_pool_config;
using devrt::memory::storage;

constexpr std::uint64_t kib = 1024;
constexpr std::uint64_t mib = 1024 * kib;
constexpr std::uint64_t alignment = 512;

bool contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

sliced_pool_config sliced(std::uint64_t page, std::optional<std::uint64_t> slice = {},
                          std::optional<std::uint64_t> cap = {}) {
  sliced_pool_config c;
  c.page_size = page;
  c.max_slice_size = slice;
  c.max_pool_size = cap;
  return c;
}

exclusive_pool_config exclusive(std::uint64_t max, std::optional<std::uint64_t> period = {}) {
  exclusive_pool_config c;
  c.max_alloc_size = max;
  c.dealloc_period = period;
  return c;
}

/// The layout the workload starts with: zero-size, small, medium (capped) and large pools.
memory_layout first_layout() {
  return std::vector<pool_config>{exclusive(0), sliced(256 * kib, 64 * kib), sliced(4 * mib, mib, 16 * mib),
                                  exclusive(32 * mib, 50)};
}

/// The layout the workload reconfigures to.
memory_layout second_layout() { return std::vector<pool_config>{exclusive(64 * kib), sliced(8 * mib, 8 * mib)}; }

std::unique_ptr<memory_manager> make_manager(memory_layout layout, persistent_policy policy,
                                             std::uint64_t capacity = 0) {
  sim_options o;
  o.props.max_page_size = 64 * mib;
  o.props.alignment = alignment;
  o.props.capacity = capacity;
  manager_options opts;
  opts.name = "faults";
  opts.layout = std::move(layout);
  opts.policy = policy;
  return std::make_unique<memory_manager>(storage::make<sim_storage>(o), opts);
}

sim_storage* sim_of(memory_manager& m) { return m.backing_storage().backend<sim_storage>(); }

/// The device holds exactly the pages the manager reports reserved (queued pages are flushed
/// first: until then the device still holds them), and the invariants hold.
::testing::AssertionResult consistent(memory_manager& m) {
  if (const std::string p = m.check_invariants(); !p.empty()) return ::testing::AssertionFailure() << p;
  sim_storage* sim = sim_of(m);
  if (sim->pending_deallocations() > 0) {
    auto f = m.flush();
    if (!f && f.code() == errc::device_error && contains(f.err().detail, "injected")) {
      // An injected flush failure armed for the workload fired here: the queue is kept, and the
      // next flush returns it.
      if (const std::string p = m.check_invariants(); !p.empty()) return ::testing::AssertionFailure() << p;
      if (sim->pending_deallocations() == 0) return ::testing::AssertionFailure() << "a failed flush lost the queue";
      f = m.flush();
    }
    if (!f) return ::testing::AssertionFailure() << "flush: " << f.err().message();
  }
  const auto& stats = m.statistics();
  if (sim->allocated_bytes() != stats.bytes_reserved || m.usage().bytes_reserved != stats.bytes_reserved) {
    return ::testing::AssertionFailure() << "the device holds " << sim->allocated_bytes() << " bytes, the manager "
                                         << "reports " << stats.bytes_reserved << " (usage " << m.usage().bytes_reserved
                                         << ")";
  }
  if (sim->page_count() != stats.driver_allocs - stats.driver_frees) {
    return ::testing::AssertionFailure() << "the device holds " << sim->page_count() << " pages, the manager counts "
                                         << stats.driver_allocs - stats.driver_frees;
  }
  return ::testing::AssertionSuccess();
}

/// Nothing is live and, after an explicit cleanup (retried once if an injected flush failure
/// fires), the device holds nothing.
::testing::AssertionResult drained(memory_manager& m) {
  if (auto c = m.cleanup(true); !c) {
    if (c.code() != errc::device_error) return ::testing::AssertionFailure() << "cleanup: " << c.err().message();
    if (auto again = m.cleanup(true); !again) {
      return ::testing::AssertionFailure() << "cleanup after a failed flush: " << again.err().message();
    }
  }
  const auto u = m.usage();
  if (u.number_allocs != 0 || u.bytes_in_use != 0 || u.bytes_reserved != 0) {
    return ::testing::AssertionFailure() << "left after dropping everything: " << u.to_string();
  }
  sim_storage* sim = sim_of(m);
  if (sim->allocated_bytes() != 0 || sim->page_count() != 0 || sim->pending_deallocations() != 0) {
    return ::testing::AssertionFailure() << "the device still holds " << sim->allocated_bytes() << " bytes in "
                                         << sim->page_count() << " pages (" << sim->pending_deallocations()
                                         << " queued)";
  }
  if (const std::string p = m.check_invariants(); !p.empty()) return ::testing::AssertionFailure() << p;
  return ::testing::AssertionSuccess();
}

/// A fault seen by the workload.
struct fault {
  std::string phase;
  devrt::error error;
};

/// A scripted workload over one manager. Every reserve, cleanup and configure goes through a
/// helper that, when the device fails, checks what the caller got and the manager's state, retries
/// after an explicit cleanup, and carries on with the retried result, so the script runs to its end
/// whatever fails.
class workload {
 public:
  explicit workload(memory_manager& m) : m_(m) {}

  /// The steps, in order, each with its phase name.
  static const std::vector<std::pair<std::string, std::function<void(workload&)>>>& steps() {
    static const std::vector<std::pair<std::string, std::function<void(workload&)>>> all{
        {"reserve",
         [](workload& w) {
           for (std::uint64_t s :
                {std::uint64_t{0}, 100 * std::uint64_t{1}, 4 * kib, 60 * kib, 200 * kib, mib, 3 * mib, 20 * mib}) {
             w.keep(w.reserve(s));
           }
           w.drop_every_other();
           for (std::uint64_t s : {100 * std::uint64_t{1}, mib, 20 * mib, 0 * std::uint64_t{1}}) w.keep(w.reserve(s));
         }},
        {"bind",
         [](workload& w) {
           memory_handle reserved = w.reserve(30 * mib);  // a page of its own
           memory_handle assigned = memory_handle::make();
           auto r = w.m_.bind(std::move(reserved), assigned, 7);
           EXPECT_TRUE(r) << r.err().message();
           w.keep(std::move(assigned));
         }},
        {"persistent",
         [](workload& w) {
           w.m_.mode(allocation_mode::persistent);
           for (std::uint64_t s : {64 * kib, 64 * kib, mib, std::uint64_t{7}}) w.keep(w.reserve(s));
           w.drop_where([](const memory_handle& h, std::size_t i) {
             return i % 3 == 0 && h.raw()->loc.pool == location::persistent_pool;
           });
           w.keep(w.reserve(64 * kib));
           w.keep(w.reserve(3 * kib));
           w.m_.mode(allocation_mode::automatic);
         }},
        {"cleanup",
         [](workload& w) {
           w.drop_every_other();
           w.cleanup();
           w.keep(w.reserve(4 * kib));
           w.keep(w.reserve(3 * mib));
         }},
        {"configure",
         [](workload& w) {
           const auto kept = w.configure(second_layout());
           if (w.m_.policy() != persistent_policy::enforced) {
             EXPECT_FALSE(kept.applied) << "dynamic memory is live: the layout must be kept";
           }
           // Drop the dynamic allocations; the persistent ones survive reconfiguration.
           w.drop_where(
               [](const memory_handle& h, std::size_t) { return h.raw()->loc.pool != location::persistent_pool; });
           const auto applied = w.configure(second_layout());
           EXPECT_TRUE(applied.applied) << applied.live_allocations << " dynamic allocations still live";
           for (std::uint64_t s : {100 * std::uint64_t{1}, 40 * kib, 300 * kib, 5 * mib, 8 * mib}) {
             w.keep(w.reserve(s));
           }
         }},
        {"capture",
         [](workload& w) {
           w.m_.capture_begin();
           w.keep(w.reserve(64 * kib));  // a persistent size seen before
           memory_handle scratch = w.reserve(2000);
           scratch.reset();  // freed inside the window: pinned by capture_end
           w.keep(w.reserve(9000));
           auto pins = w.m_.capture_end();
           EXPECT_TRUE(pins) << pins.err().message();
           if (pins) {
             for (auto& p : *pins) w.keep(std::move(p));
           }
         }},
        {"after",
         [](workload& w) {
           w.drop_every_other();
           w.keep(w.reserve(100));
           w.keep(w.reserve(6 * mib));
           w.keep(w.reserve(2 * mib));
         }},
    };
    return all;
  }

  /// Runs every step; `before(i)` runs before step i.
  void run(const std::function<void(std::size_t)>& before = {}) {
    for (std::size_t i = 0; i < steps().size(); ++i) {
      if (before) before(i);
      phase_ = steps()[i].first;
      calls_before_phase_.emplace_back(phase_, sim_of(m_)->alloc_calls());
      steps()[i].second(*this);
      EXPECT_TRUE(consistent(m_)) << "after phase " << phase_;
    }
  }

  void drop_all() { kept_.clear(); }
  [[nodiscard]] const std::vector<fault>& faults() const { return faults_; }
  /// The storage allocation calls made before each phase began, in step order.
  [[nodiscard]] const std::vector<std::pair<std::string, std::uint64_t>>& calls_before_phase() const {
    return calls_before_phase_;
  }

 private:
  void keep(memory_handle h) {
    if (!h.empty()) kept_.push_back(std::move(h));
  }
  void drop_every_other() {
    drop_where([](const memory_handle&, std::size_t i) { return i % 2 == 0; });
  }
  template <class Pred>
  void drop_where(Pred pred) {
    std::vector<memory_handle> left;
    for (std::size_t i = 0; i < kept_.size(); ++i) {
      if (!pred(kept_[i], i)) left.push_back(std::move(kept_[i]));
    }
    kept_ = std::move(left);
  }

  memory_handle reserve(std::uint64_t size) {
    const auto before = m_.usage();
    sim_storage* sim = sim_of(m_);
    auto r = m_.reserve(size);
    if (r) return std::move(*r);
    faults_.push_back({phase_, r.err()});
    const devrt::error& e = r.err();
    // What the caller gets: out_of_memory with the page the device refused, the bytes it holds and
    // its capacity, in the message too.
    EXPECT_EQ(e.code, errc::out_of_memory) << e.message();
    EXPECT_TRUE(contains(e.detail, "injected")) << e.detail;
    EXPECT_GE(e.size, size) << "the refused page is smaller than the request";
    EXPECT_EQ(e.size % alignment, 0u) << "the refused page is not a whole number of alignment units";
    EXPECT_EQ(e.in_use, sim->allocated_bytes());
    EXPECT_EQ(e.limit, sim->properties().capacity);
    const std::string msg = e.message();
    EXPECT_TRUE(contains(msg, "out of device memory")) << msg;
    EXPECT_TRUE(contains(msg, "refused " + std::to_string(e.size) + " bytes")) << msg;
    EXPECT_TRUE(contains(msg, std::to_string(e.in_use) + " bytes held by devrt")) << msg;
    // The failed reserve left nothing behind.
    EXPECT_EQ(m_.usage(), before) << "phase " << phase_;
    EXPECT_EQ(m_.statistics().out_of_memory, 1u);
    EXPECT_TRUE(consistent(m_)) << "after the fault in phase " << phase_;
    // Retry after an explicit cleanup.
    auto c = m_.cleanup(true);
    EXPECT_TRUE(c) << c.err().message();
    auto again = m_.reserve(size);
    EXPECT_TRUE(again) << "the retry of reserve(" << size << ") failed: " << again.err().message();
    EXPECT_TRUE(consistent(m_)) << "after the retry in phase " << phase_;
    return again ? std::move(*again) : memory_handle();
  }

  void cleanup() {
    auto r = m_.cleanup(true);
    if (r) return;
    check_flush_failure(r.err(), "cleanup");
    auto again = m_.cleanup(true);
    EXPECT_TRUE(again) << "cleanup after a failed flush: " << again.err().message();
  }

  devrt::memory::configure_outcome configure(const memory_layout& layout) {
    const auto before = m_.layout();
    const auto live = m_.usage();
    auto r = m_.configure(layout);
    if (r) return *r;
    check_flush_failure(r.err(), "configure");
    EXPECT_EQ(m_.layout(), before) << "a failed configure changed the layout";
    EXPECT_EQ(m_.usage().number_allocs, live.number_allocs) << "a failed configure dropped live memory";
    auto again = m_.configure(layout);
    EXPECT_TRUE(again) << "configure after a failed flush: " << again.err().message();
    return again ? *again : devrt::memory::configure_outcome{};
  }

  void check_flush_failure(const devrt::error& e, const char* what) {
    faults_.push_back({phase_, e});
    sim_storage* sim = sim_of(m_);
    EXPECT_EQ(e.code, errc::device_error) << what << ": " << e.message();
    EXPECT_TRUE(contains(e.detail, "injected flush failure")) << e.detail;
    EXPECT_EQ(e.size, sim->pending_deallocations()) << "the error counts the pages left queued";
    EXPECT_GT(sim->pending_deallocations(), 0u) << "the queue is kept for a later flush";
    EXPECT_TRUE(contains(e.message(), "device error")) << e.message();
    EXPECT_EQ(m_.check_invariants(), "") << what;
    // The queued pages are still on the device, no longer in the manager.
    EXPECT_GE(sim->allocated_bytes(), m_.statistics().bytes_reserved);
  }

  memory_manager& m_;
  std::vector<memory_handle> kept_;
  std::vector<fault> faults_;
  std::string phase_;
  std::vector<std::pair<std::string, std::uint64_t>> calls_before_phase_;
};

/// The phase in which the n-th allocation call (1-based) of a clean run is made.
std::string phase_of_call(const std::vector<std::pair<std::string, std::uint64_t>>& before, std::uint64_t n) {
  // The last phase that began before the call (a phase that allocates nothing begins with the
  // same count as the next one, which is the one that makes the call).
  std::string phase;
  for (const auto& [name, calls] : before) {
    if (calls < n) phase = name;
  }
  return phase;
}

class EveryAllocation : public ::testing::TestWithParam<persistent_policy> {};

TEST_P(EveryAllocation, FailsCleanlyAndTheRetrySucceeds) {
  // A clean run: how many allocations the workload makes, and in which phase.
  std::uint64_t calls = 0;
  std::vector<std::pair<std::string, std::uint64_t>> phases;
  {
    auto m = make_manager(first_layout(), GetParam());
    workload w(*m);
    w.run();
    EXPECT_TRUE(w.faults().empty());
    calls = sim_of(*m)->alloc_calls();
    phases = w.calls_before_phase();
    w.drop_all();
    EXPECT_TRUE(drained(*m));
  }
  ASSERT_GE(calls, 12u) << "the workload makes too few allocations to mean anything";

  // The phases that allocate in a clean run: a fault must reach each of them.
  std::set<std::string> allocating;
  for (std::size_t i = 0; i < phases.size(); ++i) {
    const std::uint64_t end = i + 1 < phases.size() ? phases[i + 1].second : calls;
    if (end > phases[i].second) allocating.insert(phases[i].first);
  }
  for (const char* phase : {"reserve", "bind", "persistent", "configure", "capture"}) {
    EXPECT_EQ(allocating.count(phase), 1u) << "phase " << phase << " makes no device allocation";
  }
  std::set<std::string> phases_hit;
  for (std::uint64_t n = 1; n <= calls + 1; ++n) {
    SCOPED_TRACE("allocation " + std::to_string(n) + " of " + std::to_string(calls) + " fails");
    auto m = make_manager(first_layout(), GetParam());
    sim_of(*m)->fail_allocation(n);
    workload w(*m);
    w.run();
    if (n <= calls) {
      ASSERT_EQ(w.faults().size(), 1u) << "exactly one reserve sees the injected failure";
      EXPECT_EQ(w.faults()[0].phase, phase_of_call(phases, n));
      phases_hit.insert(w.faults()[0].phase);
    } else {
      EXPECT_TRUE(w.faults().empty()) << "past the last allocation nothing fails";
    }
    w.drop_all();
    EXPECT_TRUE(drained(*m));
    if (::testing::Test::HasFailure()) break;  // one failing N explains the rest
  }
  EXPECT_EQ(phases_hit, allocating) << "a phase that allocates never saw a fault";
  std::printf("[ faults   ] policy %s: each of %llu device allocations failed in turn, in %zu phases\n",
              devrt::memory::to_string(GetParam()), static_cast<unsigned long long>(calls), phases_hit.size());
}

INSTANTIATE_TEST_SUITE_P(Policies, EveryAllocation,
                         ::testing::Values(persistent_policy::enabled, persistent_policy::size_match,
                                           persistent_policy::enforced),
                         [](const ::testing::TestParamInfo<persistent_policy>& p) {
                           std::string name = devrt::memory::to_string(p.param);
                           for (char& c : name) c = c == '-' ? '_' : c;
                           return name;
                         });

TEST(MemoryFaults, AFlushFailsBeforeEachStep) {
  const std::size_t steps = workload::steps().size();
  std::uint64_t fired = 0;
  for (std::size_t s = 0; s < steps; ++s) {
    SCOPED_TRACE("the next flush fails from step " + workload::steps()[s].first);
    auto m = make_manager(first_layout(), persistent_policy::enabled);
    workload w(*m);
    w.run([&](std::size_t i) {
      if (i == s) sim_of(*m)->fail_next_flush();
    });
    for (const auto& f : w.faults()) {
      EXPECT_EQ(f.error.code, errc::device_error) << f.error.message();
      ++fired;
    }
    w.drop_all();
    EXPECT_TRUE(drained(*m));
  }
  EXPECT_GE(fired, 3u) << "too few injected flush failures reached a cleanup or a configure";
  std::printf("[ faults   ] a flush failed before each of %zu steps; %llu reached a cleanup or a configure\n", steps,
              static_cast<unsigned long long>(fired));
}

TEST(MemoryFaults, FlushFailureDuringConfigureKeepsTheLayoutAndTheRetryApplies) {
  auto m = make_manager(first_layout(), persistent_policy::enabled);
  const auto before = m->layout();
  {
    auto a = m->reserve(100);
    auto b = m->reserve(3 * mib);
    ASSERT_TRUE(a && b);
  }  // dropped: their pages are free, returned by configure's cleanup
  m->mode(allocation_mode::persistent);
  auto weights = m->reserve(mib);
  ASSERT_TRUE(weights);
  m->mode(allocation_mode::automatic);
  sim_of(*m)->fail_next_flush();
  auto r = m->configure(second_layout());
  ASSERT_FALSE(r) << "the injected flush failure did not reach configure";
  EXPECT_EQ(r.code(), errc::device_error);
  EXPECT_TRUE(contains(r.err().message(), "injected flush failure")) << r.err().message();
  EXPECT_EQ(m->layout(), before) << "the layout changed although configure failed";
  EXPECT_EQ(m->check_invariants(), "");
  EXPECT_GT(sim_of(*m)->pending_deallocations(), 0u);
  auto again = m->configure(second_layout());
  ASSERT_TRUE(again) << again.err().message();
  EXPECT_TRUE(again->applied);
  EXPECT_NE(m->layout(), before);
  EXPECT_TRUE(consistent(*m));
  EXPECT_TRUE(m->get_storage(*weights)) << "persistent memory survives the failed and the applied configure";
  weights->reset();
  EXPECT_TRUE(drained(*m));
}

TEST(MemoryFaults, FailureInsideACaptureKeepsTheWindowAndPinsOnlyWhatWasTouched) {
  auto m = make_manager(first_layout(), persistent_policy::enabled);
  m->capture_begin();
  auto a = m->reserve(4 * kib);
  ASSERT_TRUE(a);
  sim_of(*m)->fail_allocation(1);
  auto b = m->reserve(8 * kib);
  ASSERT_FALSE(b);
  EXPECT_EQ(b.code(), errc::out_of_memory);
  EXPECT_EQ(b.err().size, 8 * kib) << "a persistent slice is asked for at its exact aligned size";
  EXPECT_TRUE(m->capturing()) << "a failed reserve closed the capture window";
  EXPECT_EQ(m->check_invariants(), "");
  // An explicit cleanup inside the window frees nothing (the window may use every slice).
  ASSERT_TRUE(m->cleanup(true));
  EXPECT_EQ(m->usage().bytes_reserved, 4 * kib);
  auto retry = m->reserve(8 * kib);
  ASSERT_TRUE(retry) << retry.err().message();
  auto pins = m->capture_end();
  ASSERT_TRUE(pins) << pins.err().message();
  EXPECT_EQ(pins->size(), 2u) << "the failed reserve touched no slice";
  EXPECT_TRUE(consistent(*m));
  a->reset();
  retry->reset();
  pins->clear();
  EXPECT_TRUE(drained(*m));
}

TEST(MemoryFaults, CapacityShrinksUnderLiveMemory) {
  auto m = make_manager(first_layout(), persistent_policy::enabled);
  sim_storage* sim = sim_of(*m);
  std::vector<memory_handle> live;
  for (std::uint64_t s : {100 * std::uint64_t{1}, 200 * kib, 3 * mib, 20 * mib}) {
    auto r = m->reserve(s);
    ASSERT_TRUE(r) << r.err().message();
    live.push_back(std::move(*r));
  }
  const std::uint64_t held = sim->allocated_bytes();
  sim->set_capacity(held);
  // Served from pages already held: no device allocation, no error.
  auto small = m->reserve(100);
  ASSERT_TRUE(small) << "a reserve that fits a held page failed: " << small.err().message();
  // A new page is refused, with the capacity and the bytes held.
  auto big = m->reserve(3 * mib);
  ASSERT_FALSE(big);
  EXPECT_EQ(big.code(), errc::out_of_memory);
  EXPECT_EQ(big.err().limit, held);
  EXPECT_EQ(big.err().in_use, held);
  EXPECT_TRUE(contains(big.err().message(), "capacity " + std::to_string(held))) << big.err().message();
  EXPECT_TRUE(consistent(*m));
  // Freeing memory and cleaning up makes room: the retry succeeds under the same capacity.
  live[2].reset();  // the 3 MiB allocation: its exclusive page becomes free
  ASSERT_TRUE(m->cleanup(true));
  auto retry = m->reserve(3 * mib);
  ASSERT_TRUE(retry) << retry.err().message();
  EXPECT_LE(sim->allocated_bytes(), held);
  EXPECT_TRUE(consistent(*m));
  live.clear();
  small->reset();
  retry->reset();
  EXPECT_TRUE(drained(*m));
}

TEST(MemoryFaults, ZeroSizeReserveWhoseSlotIsRefused) {
  auto m = make_manager(first_layout(), persistent_policy::enabled);
  sim_of(*m)->fail_allocation(1);
  auto r = m->reserve(0);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.code(), errc::out_of_memory);
  EXPECT_EQ(r.err().size, alignment) << "a zero-size allocation takes one alignment unit of the device";
  EXPECT_EQ(m->usage().number_allocs, 0u);
  EXPECT_TRUE(consistent(*m));
  auto retry = m->reserve(0);
  ASSERT_TRUE(retry) << retry.err().message();
  EXPECT_EQ(m->get_storage(*retry)->size, 0u);
  retry->reset();
  EXPECT_TRUE(drained(*m));
}

TEST(MemoryFaults, RepeatedFaultsNeverLeak) {
  // Every third allocation fails, for a long mixed run: the accounting never drifts.
  auto m = make_manager(first_layout(), persistent_policy::size_match);
  sim_storage* sim = sim_of(*m);
  std::vector<memory_handle> live;
  std::uint64_t failures = 0;
  std::uint64_t x = 12345;
  for (int i = 0; i < 3000; ++i) {
    if (sim->alloc_calls() % 3 == 0) sim->fail_allocation(1);
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    const std::uint64_t sizes[] = {0, 100, 4 * kib, 60 * kib, 700 * kib, 3 * mib, 20 * mib};
    const std::uint64_t size = sizes[(x >> 33) % std::size(sizes)];
    if ((x >> 20) % 11 == 0) m->mode((x >> 40) % 2 == 0 ? allocation_mode::persistent : allocation_mode::automatic);
    auto r = m->reserve(size);
    if (r) {
      live.push_back(std::move(*r));
    } else {
      ASSERT_EQ(r.code(), errc::out_of_memory) << r.err().message();
      ++failures;
    }
    if (live.size() > 40 || (x >> 50) % 7 == 0) {
      live.erase(live.begin(), live.begin() + static_cast<std::ptrdiff_t>(live.size() / 2));
    }
    if ((x >> 45) % 29 == 0) {
      ASSERT_TRUE(m->cleanup(true));
    }
    if (i % 100 == 0) {
      ASSERT_TRUE(consistent(*m)) << "step " << i;
    }
  }
  EXPECT_GT(failures, 100u);
  EXPECT_EQ(m->statistics().out_of_memory, failures);
  live.clear();
  EXPECT_TRUE(drained(*m));
}

}  // namespace
