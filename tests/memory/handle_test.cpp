// Handles and bindings: identities, counts, conversions, staleness after bind, concurrent copies
// and drops through the lock-free release queue, and handles that outlive their manager.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "devrt/devices/sim_storage.hpp"
#include "devrt/memory/memory_manager.hpp"

namespace {

using devrt::errc;
using devrt::devices::sim_options;
using devrt::devices::sim_storage;
using devrt::memory::allocation_mode;
using devrt::memory::manager_options;
using devrt::memory::memory_binding;
using devrt::memory::memory_handle;
using devrt::memory::memory_id;
using devrt::memory::memory_manager;
using devrt::memory::storage;

sim_options test_sim() {
  sim_options o;
  o.props = {128ULL << 20, 32, 0};
  return o;
}

std::unique_ptr<memory_manager> make_manager() {
  return std::make_unique<memory_manager>(storage::make<sim_storage>(test_sim()), manager_options{});
}

memory_handle reserve_ok(memory_manager& m, std::uint64_t size) {
  auto r = m.reserve(size);
  EXPECT_TRUE(r) << "reserve(" << size << "): " << (r ? "" : r.err().message());
  return r ? std::move(*r) : memory_handle{};
}

// Descriptors are recycled through per-thread caches and a process-wide pool: made on some
// threads, dropped on others (as client threads create and a device thread frees), by threads
// that exit with descriptors in their caches. Every id stays unique, every handle keeps its own
// identity, and a stale copy never sees a reused descriptor's new id.
TEST(Handle, DescriptorsRecycledAcrossThreadsKeepUniqueIdentities) {
  constexpr int producers = 4;
  constexpr int rounds = 6;
  constexpr int per_round = 3000;
  std::vector<std::vector<std::uint64_t>> seen(producers * rounds);
  for (int round = 0; round < rounds; ++round) {
    std::vector<std::vector<memory_handle>> made(producers);
    std::vector<std::thread> threads;
    for (int p = 0; p < producers; ++p) {
      threads.emplace_back([&, p] {
        for (int i = 0; i < per_round; ++i) made[p].push_back(memory_handle::make());
      });
    }
    for (auto& t : threads) t.join();  // the producers exit: their caches are emptied
    threads.clear();
    for (int p = 0; p < producers; ++p) {
      auto& out = seen[round * producers + p];
      for (const auto& h : made[p]) {
        EXPECT_EQ(h.use_count(), 1u);
        out.push_back(h.id().value);
      }
    }
    // Other threads drop them, keeping one copy of every 100th to check it is untouched later.
    std::vector<memory_handle> kept;
    for (int p = 0; p < producers; ++p) {
      for (std::size_t i = 0; i < made[p].size(); i += 100) kept.push_back(made[p][i]);
    }
    for (int p = 0; p < producers; ++p) {
      threads.emplace_back([&, p] { made[p].clear(); });
    }
    for (auto& t : threads) t.join();
    std::size_t k = 0;
    for (int p = 0; p < producers; ++p) {
      for (std::size_t i = 0; i < per_round; i += 100, ++k) {
        EXPECT_EQ(kept[k].id().value, seen[round * producers + p][i]) << "a held descriptor was reused";
        EXPECT_EQ(kept[k].use_count(), 1u);
      }
    }
  }
  std::set<std::uint64_t> ids;
  for (const auto& v : seen) {
    for (auto id : v) {
      EXPECT_NE(id, 0u);
      ASSERT_TRUE(ids.insert(id).second) << "id " << id << " given twice";
    }
  }
  // The calling thread makes and drops many in a row: its cache spills to the shared pool and
  // refills from it.
  for (int i = 0; i < 10; ++i) {
    std::vector<memory_handle> many(1000);
    for (auto& h : many) h = memory_handle::make();
    for (auto& h : many) ASSERT_TRUE(ids.insert(h.id().value).second);
  }
}

TEST(Handle, MakeGivesFreshIds) {
  std::set<std::uint64_t> ids;
  for (int i = 0; i < 1000; ++i) {
    memory_handle h = memory_handle::make();
    ASSERT_FALSE(h.empty());
    ASSERT_TRUE(static_cast<bool>(h));
    EXPECT_NE(h.id().value, 0u);
    EXPECT_TRUE(ids.insert(h.id().value).second) << "id " << h.id().value << " given twice";
    EXPECT_TRUE(h.can_mut());
    EXPECT_EQ(h.use_count(), 1u);
  }
  // Ids of reserved memory are fresh too, distinct from those of make().
  auto m = make_manager();
  std::vector<memory_handle> live;
  for (int i = 0; i < 100; ++i) {
    live.push_back(reserve_ok(*m, 64));
    EXPECT_TRUE(ids.insert(live.back().id().value).second);
  }
  // Recycled descriptors get fresh ids as well.
  live.clear();
  for (int i = 0; i < 100; ++i) {
    live.push_back(reserve_ok(*m, 64));
    EXPECT_TRUE(ids.insert(live.back().id().value).second) << "a recycled descriptor kept its id";
  }
}

TEST(Handle, EmptyHandle) {
  memory_handle h;
  EXPECT_TRUE(h.empty());
  EXPECT_FALSE(static_cast<bool>(h));
  EXPECT_EQ(h.id(), memory_id{});
  EXPECT_EQ(h.id().value, 0u);
  EXPECT_FALSE(h.can_mut()) << "an empty handle refers to nothing, so nothing to mutate";
  EXPECT_EQ(h.use_count(), 0u);
  EXPECT_EQ(h.raw(), nullptr);
  memory_binding b = h.binding();
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(b.id().value, 0u);
  memory_binding b2 = memory_handle{}.binding();
  EXPECT_TRUE(b2.empty());
  h.reset();  // no-op
  EXPECT_TRUE(h.empty());
  memory_handle c = h;  // copying an empty handle
  EXPECT_TRUE(c.empty());
  EXPECT_TRUE(c == h);

  auto m = make_manager();
  EXPECT_EQ(m->get_storage(h).code(), errc::not_found);
  EXPECT_EQ(m->get_cursor(h).code(), errc::not_found);
  EXPECT_EQ(m->get_resource(h).code(), errc::not_found);
  EXPECT_EQ(m->get_storage(b).code(), errc::not_found);
  memory_handle r = reserve_ok(*m, 100);
  EXPECT_EQ(m->bind(r, memory_handle{}).code(), errc::invalid_argument);
  EXPECT_EQ(m->bind(memory_handle{}, memory_handle::make()).code(), errc::not_found);
  EXPECT_TRUE(m->get_storage(r)) << "a failed bind must not touch the reserved memory";
  EXPECT_EQ(m->check_invariants(), "");
}

TEST(Handle, CopiesShareTheId) {
  auto m = make_manager();
  memory_handle a = reserve_ok(*m, 256);
  memory_handle b = a;
  memory_handle c;
  c = b;
  EXPECT_EQ(a.id(), b.id());
  EXPECT_EQ(a.id(), c.id());
  EXPECT_TRUE(a == b);
  EXPECT_TRUE(a == c);
  EXPECT_EQ(a.use_count(), 3u);
  auto sa = m->get_storage(a);
  auto sc = m->get_storage(c);
  ASSERT_TRUE(sa);
  ASSERT_TRUE(sc);
  EXPECT_EQ(*sa, *sc);
  memory_handle other = reserve_ok(*m, 256);
  EXPECT_FALSE(a == other);
  EXPECT_NE(a.id(), other.id());
  // The memory stays while any copy is alive.
  a.reset();
  b.reset();
  EXPECT_EQ(m->usage().number_allocs, 2u);
  EXPECT_TRUE(m->get_storage(c));
  c.reset();
  EXPECT_EQ(m->usage().number_allocs, 1u);
  EXPECT_EQ(m->check_invariants(), "");
}

TEST(Handle, CanMutCountsUserHandlesOnly) {
  auto m = make_manager();
  memory_handle h = reserve_ok(*m, 128);
  EXPECT_TRUE(h.can_mut());
  {
    memory_handle copy = h;  // NOLINT(performance-unnecessary-copy-initialization)
    EXPECT_FALSE(h.can_mut()) << "two user handles share the memory";
    EXPECT_FALSE(copy.can_mut());
    EXPECT_EQ(h.use_count(), 2u);
  }
  EXPECT_TRUE(h.can_mut()) << "the copy was dropped";
  memory_binding b1 = h.binding();
  memory_binding b2 = b1;  // NOLINT(performance-unnecessary-copy-initialization)
  memory_binding b3 = h.binding();
  EXPECT_TRUE(h.can_mut()) << "bindings do not count as user handles";
  EXPECT_EQ(h.use_count(), 1u);
  EXPECT_EQ(b1.id(), h.id());
  EXPECT_EQ(b2.id(), h.id());
  memory_handle copy = h;
  EXPECT_FALSE(h.can_mut());
  copy.reset();
  EXPECT_TRUE(h.can_mut());
  // Pins returned by a capture are user handles too.
  m->capture_begin();
  memory_handle p = reserve_ok(*m, 64);
  auto pins = m->capture_end();
  ASSERT_TRUE(pins);
  ASSERT_EQ(pins->size(), 1u);
  EXPECT_EQ((*pins)[0].id(), p.id());
  EXPECT_FALSE(p.can_mut());
  pins->clear();
  EXPECT_TRUE(p.can_mut());
}

TEST(Handle, BindingKeepsMemoryAliveWithoutAHandle) {
  auto m = make_manager();
  memory_handle h = reserve_ok(*m, 1000);
  const auto before = m->usage();
  memory_binding b = h.binding();
  h.reset();
  EXPECT_EQ(m->usage(), before) << "the binding must keep the memory";
  auto st = m->get_storage(b);
  ASSERT_TRUE(st) << st.err().message();
  EXPECT_EQ(st->size, 1000u);
  b.reset();
  EXPECT_EQ(m->usage().number_allocs, 0u);
  EXPECT_EQ(m->usage().bytes_in_use, 0u);
  EXPECT_EQ(m->check_invariants(), "");
}

TEST(Handle, RvalueBindingConvertsTheHandle) {
  auto m = make_manager();
  memory_handle h = reserve_ok(*m, 300);
  memory_handle other = h;
  const memory_id id = h.id();
  memory_binding b = std::move(h).binding();
  // NOLINTNEXTLINE(bugprone-use-after-move): the moved-from state is what is tested
  EXPECT_TRUE(h.empty()) << "binding() && gives the handle's reference to the binding";
  EXPECT_EQ(b.id(), id);
  EXPECT_EQ(other.use_count(), 1u) << "the converted handle no longer counts";
  EXPECT_TRUE(other.can_mut());
  other.reset();
  EXPECT_EQ(m->usage().number_allocs, 1u) << "the binding keeps the memory";
  auto st = m->get_storage(b);
  ASSERT_TRUE(st);
  EXPECT_EQ(st->size, 300u);
  b.reset();
  EXPECT_EQ(m->usage().number_allocs, 0u);
  // On an lvalue, binding() leaves the handle as it was.
  memory_handle k = reserve_ok(*m, 10);
  memory_binding kb = k.binding();
  EXPECT_FALSE(k.empty());
  EXPECT_EQ(k.use_count(), 1u);
  EXPECT_EQ(kb.id(), k.id());
  EXPECT_EQ(m->check_invariants(), "");
}

TEST(Handle, Moves) {
  auto m = make_manager();
  memory_handle a = reserve_ok(*m, 64);
  const memory_id id = a.id();
  memory_handle b = std::move(a);
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(b.id(), id);
  EXPECT_EQ(b.use_count(), 1u) << "a move does not add a reference";
  EXPECT_TRUE(b.can_mut());
  memory_handle c = reserve_ok(*m, 64);
  c = std::move(b);        // c's previous memory is dropped
  EXPECT_TRUE(b.empty());  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(c.id(), id);
  EXPECT_EQ(m->usage().number_allocs, 1u);
  // Self-assignment keeps the handle and its count.
  memory_handle& alias = c;
  c = alias;
  EXPECT_EQ(c.id(), id);
  EXPECT_EQ(c.use_count(), 1u);
  c = std::move(alias);
  EXPECT_EQ(c.id(), id) << "self-move-assignment lost the handle";
  EXPECT_EQ(m->usage().number_allocs, 1u);
  // Bindings move the same way.
  memory_binding x = c.binding();
  memory_binding y = std::move(x);
  EXPECT_TRUE(x.empty());  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(y.id(), id);
  memory_binding z;
  z = std::move(y);
  EXPECT_EQ(z.id(), id);
  c.reset();
  EXPECT_EQ(m->usage().number_allocs, 1u);
  z = memory_binding{};
  EXPECT_EQ(m->usage().number_allocs, 0u);
  EXPECT_EQ(m->check_invariants(), "");
}

TEST(Handle, UseCount) {
  auto m = make_manager();
  memory_handle h = reserve_ok(*m, 8);
  std::vector<memory_handle> copies;
  for (std::uint64_t i = 1; i <= 10; ++i) {
    EXPECT_EQ(h.use_count(), i);
    copies.push_back(h);
  }
  std::vector<memory_binding> bindings(5, h.binding());
  EXPECT_EQ(h.use_count(), 11u);
  for (std::uint64_t i = 10; i > 0; --i) {
    copies.pop_back();
    EXPECT_EQ(h.use_count(), i);
  }
  memory_handle fresh = memory_handle::make();
  EXPECT_EQ(fresh.use_count(), 1u);
  memory_handle fresh2 = fresh;  // NOLINT(performance-unnecessary-copy-initialization)
  EXPECT_EQ(fresh.use_count(), 2u);
}

TEST(Handle, StaleAfterBind) {
  auto m = make_manager();
  memory_handle reserved = reserve_ok(*m, 500);
  memory_handle old_copy = reserved;
  memory_binding old_binding = reserved.binding();
  auto where = m->get_storage(reserved);
  ASSERT_TRUE(where);
  memory_handle assigned = memory_handle::make();
  auto r = m->bind(std::move(reserved), assigned, 42);
  ASSERT_TRUE(r) << r.err().message();

  // The memory now belongs to `assigned`, at the same place.
  auto now = m->get_storage(assigned);
  ASSERT_TRUE(now) << now.err().message();
  EXPECT_EQ(*now, *where);
  auto cursor = m->get_cursor(assigned);
  ASSERT_TRUE(cursor);
  EXPECT_EQ(*cursor, 42u);
  EXPECT_TRUE(assigned.can_mut());

  // Copies of the reserved handle are stale.
  EXPECT_EQ(m->get_storage(old_copy).code(), errc::not_found);
  EXPECT_EQ(m->get_cursor(old_copy).code(), errc::not_found);
  EXPECT_EQ(m->get_resource(old_copy).code(), errc::not_found);
  EXPECT_EQ(m->get_storage(old_binding).code(), errc::not_found);
  EXPECT_EQ(m->bind(old_copy, memory_handle::make()).code(), errc::not_found) << "a stale handle cannot be bound";
  // Stale references do not keep the memory: only `assigned` does.
  EXPECT_EQ(m->usage().number_allocs, 1u);
  assigned.reset();
  EXPECT_EQ(m->usage().number_allocs, 0u) << "a stale copy kept the memory alive";
  EXPECT_EQ(m->get_storage(old_copy).code(), errc::not_found);
  old_copy.reset();
  old_binding.reset();
  EXPECT_EQ(m->check_invariants(), "");
}

TEST(Handle, BindToAHandleWithMemoryIsAlreadyBound) {
  auto m = make_manager();
  memory_handle a = reserve_ok(*m, 64);
  memory_handle b = reserve_ok(*m, 64);
  EXPECT_EQ(m->bind(a, b).code(), errc::already_bound);
  EXPECT_EQ(m->bind(a, a).code(), errc::already_bound);
  memory_handle fresh = memory_handle::make();
  ASSERT_TRUE(m->bind(a, fresh));
  memory_handle c = reserve_ok(*m, 64);
  EXPECT_EQ(m->bind(c, fresh).code(), errc::already_bound) << "fresh got memory from the first bind";
  EXPECT_TRUE(m->get_storage(b));
  EXPECT_TRUE(m->get_storage(c));
  EXPECT_EQ(m->usage().number_allocs, 3u);
  EXPECT_EQ(m->check_invariants(), "");
}

TEST(Handle, NeverInitializedHandleIsNotFound) {
  auto m = make_manager();
  memory_handle h = memory_handle::make();
  EXPECT_EQ(m->get_cursor(h).code(), errc::not_found);
  EXPECT_EQ(m->get_storage(h).code(), errc::not_found);
  EXPECT_EQ(m->get_resource(h).code(), errc::not_found);
  EXPECT_EQ(m->get_cursor(h.binding()).code(), errc::not_found);
  EXPECT_EQ(m->bind(h, memory_handle::make()).code(), errc::not_found);
  EXPECT_EQ(m->check_invariants(), "");
}

TEST(Handle, HandleOfAnotherManagerIsNotFound) {
  auto m1 = make_manager();
  auto m2 = make_manager();
  memory_handle h = reserve_ok(*m1, 64);
  // Nothing to assert about m2's answer except that it does not give m1's memory away.
  auto r = m2->bind(h, memory_handle::make());
  EXPECT_FALSE(r) << "m2 bound memory of m1";
  EXPECT_TRUE(m1->get_storage(h));
  EXPECT_EQ(m1->check_invariants(), "");
  EXPECT_EQ(m2->check_invariants(), "");
}

// ---- Concurrency: copies and drops from many threads reach the owner through the queue ----

TEST(HandleConcurrency, CopiesAndDropsFromManyThreads) {
  // Rounds: the owner reserves a batch, every thread takes copies of all of it, the owner drops
  // its own references, and the threads copy, convert and drop, so the last reference to each
  // allocation goes from whichever thread gets there last, concurrently with the owner's usage()
  // calls. 8 threads x 100 rounds x 1000 operations = 100k operations per thread, and 6400 last
  // drops racing through the release queue.
  // EXPECT only (no ASSERT) while threads run: an early return would leave them unjoined.
  auto m = make_manager();
  constexpr int threads = 8;
  constexpr int rounds = 100;
  constexpr int ops_per_round = 1000;
  constexpr std::size_t batch_size = 64;

  std::vector<memory_handle> batch;
  std::atomic<int> epoch{-1};  // round published by the owner
  std::atomic<int> taken{0};   // threads that copied the current batch
  std::atomic<int> done{0};    // threads that dropped everything of the current round
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {  // NOLINT(performance-inefficient-vector-operation)
      std::mt19937 rng(static_cast<unsigned>(1234 + t));
      for (int r = 0; r < rounds; ++r) {
        while (epoch.load(std::memory_order_acquire) < r) std::this_thread::yield();
        std::vector<memory_handle> mine = batch;  // concurrent copies of the shared handles
        taken.fetch_add(1, std::memory_order_acq_rel);
        for (int it = 0; it < ops_per_round; ++it) {
          const std::size_t i = rng() % mine.size();
          if (mine[i].empty()) continue;
          switch (rng() % 5) {
            case 0: {
              memory_handle c = mine[i];
              memory_handle c2 = c;  // NOLINT(performance-unnecessary-copy-initialization)
              (void)c2.can_mut();
              break;
            }
            case 1: {
              memory_binding b = mine[i].binding();
              memory_binding b2 = b;  // NOLINT(performance-unnecessary-copy-initialization)
              break;
            }
            case 2: {
              memory_handle c = mine[i];
              memory_binding b = std::move(c).binding();
              break;
            }
            case 3: {
              memory_handle c = mine[i];
              mine[i] = c;
              break;
            }
            default:
              // Drop this thread's reference: may be the last one.
              if (rng() % 8 == 0) mine[i].reset();
              break;
          }
        }
        std::shuffle(mine.begin(), mine.end(), rng);
        mine.clear();
        done.fetch_add(1, std::memory_order_acq_rel);
        while (epoch.load(std::memory_order_acquire) == r && done.load(std::memory_order_acquire) != 0) {
          std::this_thread::yield();
        }
      }
    });
  }

  std::uint64_t polls = 0;
  for (int r = 0; r < rounds; ++r) {
    batch.clear();
    std::uint64_t bytes = 0;
    for (std::size_t i = 0; i < batch_size; ++i) {
      const std::uint64_t size = 1 + (static_cast<std::uint64_t>(r) * 131 + i * 977) % 300'000;
      // Some persistent ones: their release takes the persistent pool's path.
      m->mode(i % 16 == 0 ? allocation_mode::persistent : allocation_mode::automatic);
      batch.push_back(reserve_ok(*m, size));
      bytes += size;
    }
    m->mode(allocation_mode::automatic);
    EXPECT_EQ(m->usage().number_allocs, batch_size);
    EXPECT_EQ(m->usage().bytes_in_use, bytes);
    taken.store(0, std::memory_order_relaxed);
    done.store(0, std::memory_order_relaxed);
    epoch.store(r, std::memory_order_release);
    while (taken.load(std::memory_order_acquire) < threads) std::this_thread::yield();
    batch.clear();  // the threads hold every reference now

    std::uint64_t last_allocs = batch_size;
    while (done.load(std::memory_order_acquire) < threads) {
      const auto u = m->usage();
      ++polls;
      EXPECT_LE(u.number_allocs, last_allocs) << "round " << r << ": a freed allocation came back";
      last_allocs = u.number_allocs;
      if (polls % 16 == 0) {
        EXPECT_EQ(m->check_invariants(), "") << "round " << r;
      }
      std::this_thread::yield();
    }
    const auto u = m->usage();
    EXPECT_EQ(u.number_allocs, 0u) << "round " << r << ": every reference was dropped";
    EXPECT_EQ(u.bytes_in_use, 0u) << "round " << r;
    EXPECT_EQ(m->check_invariants(), "") << "round " << r;
    // Let the threads move on only once the round is checked.
    done.store(0, std::memory_order_release);
  }
  for (auto& th : pool) th.join();

  EXPECT_EQ(m->usage().number_allocs, 0u);
  EXPECT_EQ(m->statistics().bytes_in_use, 0u);
  EXPECT_EQ(m->check_invariants(), "");
  // The manager still works.
  memory_handle again = reserve_ok(*m, 100);
  EXPECT_TRUE(again.can_mut());
  EXPECT_EQ(m->usage().number_allocs, 1u);
  EXPECT_EQ(m->check_invariants(), "");
}

TEST(HandleConcurrency, ConcurrentLastDropsWhileTheOwnerReserves) {
  // The owner keeps reserving and handing handles to workers that drop them; every drop reaches
  // the owner through the release queue.
  auto m = make_manager();
  constexpr int workers = 4;
  constexpr int rounds = 2000;
  std::vector<std::vector<memory_handle>> inbox(workers);
  std::vector<std::atomic<bool>> ready(workers);
  std::atomic<bool> stop{false};
  std::vector<std::thread> pool;
  for (int w = 0; w < workers; ++w) {
    pool.emplace_back([&, w] {  // NOLINT(performance-inefficient-vector-operation)
      const auto i = static_cast<std::size_t>(w);
      while (!stop.load(std::memory_order_acquire)) {
        if (ready[i].load(std::memory_order_acquire)) {
          for (auto& h : inbox[i]) {
            memory_handle c = h;
            h.reset();
          }
          inbox[i].clear();
          ready[i].store(false, std::memory_order_release);
        } else {
          std::this_thread::yield();
        }
      }
    });
  }
  for (int r = 0; r < rounds; ++r) {
    const auto w = static_cast<std::size_t>(r % workers);
    while (ready[w].load(std::memory_order_acquire)) std::this_thread::yield();
    for (int k = 0; k < 8; ++k) inbox[w].push_back(reserve_ok(*m, 64 + static_cast<std::uint64_t>(k) * 1000));
    ready[w].store(true, std::memory_order_release);
    if (r % 100 == 0) {
      EXPECT_EQ(m->check_invariants(), "");
    }
  }
  for (std::size_t w = 0; w < workers; ++w) {
    while (ready[w].load(std::memory_order_acquire)) std::this_thread::yield();
  }
  stop.store(true, std::memory_order_release);
  for (auto& th : pool) th.join();
  EXPECT_EQ(m->usage().number_allocs, 0u);
  EXPECT_EQ(m->check_invariants(), "");
}

// ---- Handles that outlive their manager ----

/// Whether every descriptor of `old` was given back for reuse: fresh handles made on this thread
/// come from its cache and then from the process-wide pool, most recently freed first, so making
/// a few more than were freed meets each of them again. A descriptor leaked (or still referenced)
/// never comes back.
::testing::AssertionResult all_recycled(const std::set<const void*>& old) {
  std::vector<memory_handle> fresh;
  fresh.reserve(old.size() + 256);
  std::set<const void*> seen;
  for (std::size_t i = 0; i < old.size() + 256; ++i) {
    fresh.push_back(memory_handle::make());
    seen.insert(fresh.back().raw());
  }
  std::size_t missing = 0;
  for (const void* d : old) missing += seen.count(d) == 0 ? 1 : 0;
  if (missing == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << missing << " of " << old.size() << " descriptors were not recycled";
}

TEST(HandleLifetime, HandlesOutliveTheirManager) {
  auto m = make_manager();
  std::vector<memory_handle> handles;
  std::vector<memory_binding> bindings;
  handles.reserve(64);
  bindings.reserve(16);
  for (int i = 0; i < 50; ++i) handles.push_back(reserve_ok(*m, 64 * static_cast<std::uint64_t>(i)));
  for (int i = 0; i < 10; ++i) bindings.push_back(handles[static_cast<std::size_t>(i)].binding());
  // A binding whose handle is gone.
  {
    memory_handle h = reserve_ok(*m, 1 << 20);
    bindings.push_back(std::move(h).binding());
  }
  // Persistent memory, a capture pin, and a bound identity.
  m->mode(allocation_mode::persistent);
  handles.push_back(reserve_ok(*m, 4096));
  m->mode(allocation_mode::automatic);
  m->capture_begin();
  handles.push_back(reserve_ok(*m, 8192));
  auto pins = m->capture_end();
  ASSERT_TRUE(pins);
  for (auto& p : *pins) handles.push_back(std::move(p));
  memory_handle assigned = memory_handle::make();
  ASSERT_TRUE(m->bind(handles[20], assigned));
  handles.push_back(assigned);
  // A drop the manager has not seen yet: its descriptor sits on the release queue when the
  // manager goes away.
  handles[30].reset();
  handles[31] = handles[32];

  std::vector<memory_id> ids;
  std::set<const void*> descriptors;
  for (const auto& h : handles) {
    ids.push_back(h.id());
    if (!h.empty()) descriptors.insert(h.raw());
  }
  for (const auto& b : bindings) descriptors.insert(b.raw());

  m.reset();

  // Copying, converting and dropping stay safe (run under ASan) and keep exact counts.
  std::vector<memory_handle> copies = handles;
  std::vector<memory_binding> more;
  for (auto& h : handles) more.push_back(h.binding());  // NOLINT(performance-inefficient-vector-operation)
  for (std::size_t i = 0; i < handles.size(); ++i) {
    EXPECT_EQ(handles[i].id(), ids[i]) << i;
    EXPECT_EQ(copies[i], handles[i]) << i;
  }
  EXPECT_TRUE(handles[30].empty());
  EXPECT_EQ(handles[31].use_count(), 4u);  // handles[31], handles[32] and their copies
  EXPECT_EQ(handles[0].use_count(), 2u);   // bindings do not count
  EXPECT_EQ(assigned.use_count(), 3u);
  for (std::size_t i = 0; i < handles.size(); i += 2) handles[i].reset();
  EXPECT_EQ(copies[0].use_count(), 1u);
  EXPECT_TRUE(copies[0].can_mut());
  EXPECT_EQ(copies[31].use_count(), 3u);
  copies.clear();
  bindings.clear();
  more.clear();
  handles.clear();
  assigned.reset();
  // Nothing refers to the descriptors any more: every one was freed, none leaked.
  EXPECT_TRUE(all_recycled(descriptors));
}

TEST(HandleLifetime, ManagerDestroyedWhileOtherThreadsDropHandles) {
  // Drops that race with the manager's destructor: some reach the release queue before it runs,
  // some while it detaches the slices, some after (run under ASan and TSan: no use after free,
  // no leak, no race).
  constexpr int threads = 4;
  constexpr std::size_t count = 4000;
  for (int round = 0; round < 5; ++round) {
    auto m = make_manager();
    std::vector<memory_handle> originals;
    for (std::size_t i = 0; i < count; ++i) originals.push_back(reserve_ok(*m, 16 + (i % 50) * 64));
    std::vector<std::vector<memory_handle>> per_thread(threads, originals);
    originals.clear();
    std::atomic<std::size_t> dropped{0};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {  // NOLINT(performance-inefficient-vector-operation)
        std::vector<memory_handle>& mine = per_thread[static_cast<std::size_t>(t)];
        std::mt19937 rng(static_cast<unsigned>(round * 100 + t));
        std::shuffle(mine.begin(), mine.end(), rng);
        for (auto& h : mine) {
          memory_handle c = h;
          h.reset();
          c.reset();
          dropped.fetch_add(1, std::memory_order_relaxed);
        }
      });
    }
    while (dropped.load(std::memory_order_relaxed) < count) std::this_thread::yield();
    // Drops race with the owner's own calls too: the manager stays consistent meanwhile.
    EXPECT_EQ(m->check_invariants(), "");
    EXPECT_LE(m->usage().number_allocs, count);
    m.reset();  // while the threads are still dropping
    for (auto& th : pool) th.join();
    EXPECT_EQ(dropped.load(), count * threads);
    for (const auto& mine : per_thread) {
      EXPECT_TRUE(std::all_of(mine.begin(), mine.end(), [](const memory_handle& h) { return h.empty(); }));
    }
  }
}

TEST(HandleLifetime, HandlesDroppedFromAnotherThreadAfterTheManagerIsGone) {
  auto m = make_manager();
  std::vector<memory_handle> handles;
  handles.reserve(100);
  for (int i = 0; i < 100; ++i) handles.push_back(reserve_ok(*m, 32 * static_cast<std::uint64_t>(i + 1)));
  std::vector<memory_handle> theirs = handles;
  std::set<const void*> descriptors;
  for (const auto& h : handles) descriptors.insert(h.raw());
  m.reset();
  for (const auto& h : handles) ASSERT_EQ(h.use_count(), 2u);
  std::thread t([v = std::move(theirs)]() mutable {
    for (auto& h : v) {
      memory_handle c = h;
      h.reset();
    }
  });
  t.join();
  // The other thread's drops reached the shared descriptors without a manager.
  for (const auto& h : handles) {
    EXPECT_EQ(h.use_count(), 1u);
    EXPECT_TRUE(h.can_mut());
  }
  handles.clear();  // the last references: freed on this thread, so they come back here
  EXPECT_TRUE(all_recycled(descriptors));
}

}  // namespace
