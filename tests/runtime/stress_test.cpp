// Many threads on one device: mixed creates, reserves, drops, copies, submits that write and
// check data patterns, reads; then quiescence (nothing in use, invariants hold). And threads that
// keep posting while another thread shuts the runtime down.
//
// DEVRT_STRESS_OPS (environment) overrides the operations per thread (default 100,000).

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "devrt/runtime/runtime.hpp"
#include "runtime_test_util.hpp"

namespace {

using boost::system::error_code;
using devrt::errc;
using devrt::memory::memory_binding;
using devrt::memory::memory_handle;
using devrt::runtime::compute_client;
using devrt::runtime::runtime;
using devrt::runtime::submit_context;
using devrt_test::pattern_byte;
using devrt_test::quiet_options;

std::uint64_t ops_per_thread() {
  if (const char* v = std::getenv("DEVRT_STRESS_OPS")) return std::strtoull(v, nullptr, 10);  // NOLINT
  return 100'000;
}

void fill(void* p, std::uint64_t size, std::uint64_t seed) {
  auto* b = static_cast<std::byte*>(p);
  for (std::uint64_t i = 0; i < size; ++i) b[i] = pattern_byte(seed, i);
}

bool holds(const void* p, std::uint64_t size, std::uint64_t seed) {
  const auto* b = static_cast<const std::byte*>(p);
  for (std::uint64_t i = 0; i < size; ++i) {
    if (b[i] != pattern_byte(seed, i)) return false;
  }
  return true;
}

/// Counters shared by every thread's callbacks.
struct tally {
  std::atomic<std::uint64_t> outstanding{0};
  std::atomic<std::uint64_t> checks{0};
  std::atomic<std::uint64_t> writes{0};
  std::atomic<std::uint64_t> failures{0};
  std::atomic<std::uint64_t> errors{0};
  std::atomic<std::uint64_t> reads{0};
  std::atomic<std::uint64_t> reserves{0};
  std::atomic<std::uint64_t> creates{0};
  std::atomic<std::uint64_t> copies{0};
  std::atomic<std::uint64_t> drops{0};
  std::string first_error;
  std::mutex mutex;
  void error(const std::string& what) {
    errors.fetch_add(1);
    std::lock_guard lock(mutex);
    if (first_error.empty()) first_error = what;
  }
};

struct slot {
  memory_handle h;
  std::uint64_t seed = 0;
  std::uint64_t size = 0;
  bool written = false;
};

class worker {
 public:
  worker(compute_client c, tally& t, unsigned index) : c_(std::move(c)), t_(t), rng_(index * 7919 + 1), index_(index) {
    slots_.resize(64);
  }

  void run(std::uint64_t ops) {
    for (std::uint64_t op = 0; op < ops; ++op) {
      const unsigned r = rng_() % 100;
      slot& s = slots_[rng_() % slots_.size()];
      if (r < 55) {
        // Create (the common, cheap operation); a quarter get a pattern written by a submit.
        drop(s);
        s.size = 1 + rng_() % 512;
        s.seed = (std::uint64_t{index_} << 40) | op;
        s.h = c_.create(s.size);
        t_.creates.fetch_add(1, std::memory_order_relaxed);
        if (rng_() % 4 == 0) write(s);
      } else if (r < 60) {
        const std::uint64_t size = 1 + rng_() % 2048;
        reserves_.emplace_back(size, c_.reserve(size));
      } else if (r < 78) {
        drop(s);
      } else if (r < 86) {
        const slot& from = slots_[rng_() % slots_.size()];
        if (&from != &s) {
          drop(s);
          s = from;  // a copy of the handle: both slots share the memory and its pattern
          t_.copies.fetch_add(1, std::memory_order_relaxed);
        }
      } else if (r < 97) {
        if (s.h && !s.written) write(s);
        check(s);
      } else {
        if (s.h && s.written) reads_.emplace_back(s.seed, c_.read(s.h.binding()));
      }
      if (op % 1024 == 1023) settle();
    }
    settle();
    for (auto& s : slots_) drop(s);
    settle();
  }

 private:
  void drop(slot& s) {
    if (!s.h) return;
    // Check the pattern before release: the submit's binding keeps the memory alive even though
    // the handle is dropped right after.
    if (s.written && rng_() % 2 == 0) check(s);
    s.h.reset();
    s.written = false;
    t_.drops.fetch_add(1, std::memory_order_relaxed);
  }

  void write(slot& s) {
    if (!s.h) return;
    t_.outstanding.fetch_add(1);
    c_.submit(
        {s.h.binding()},
        [seed = s.seed, size = s.size](submit_context& ctx) {
          if (ctx.resources.size() != 1 || ctx.resources[0].size != size) return false;
          fill(ctx.resources[0].ptr, size, seed);
          return true;
        },
        [&t = t_](error_code ec, bool ok) {
          if (ec) {
            t.error("write submit: " + ec.message());
          } else if (!ok) {
            t.failures.fetch_add(1);
          }
          t.writes.fetch_add(1, std::memory_order_relaxed);
          t.outstanding.fetch_sub(1);
        });
    s.written = true;
  }

  void check(const slot& s) {
    if (!s.h || !s.written) return;
    t_.outstanding.fetch_add(1);
    c_.submit(
        {s.h.binding()},
        [seed = s.seed, size = s.size](submit_context& ctx) {
          return ctx.resources[0].size == size && holds(ctx.resources[0].ptr, size, seed);
        },
        [&t = t_](error_code ec, bool ok) {
          if (ec) {
            t.error("check submit: " + ec.message());
          } else if (!ok) {
            t.failures.fetch_add(1);
          }
          t.checks.fetch_add(1, std::memory_order_relaxed);
          t.outstanding.fetch_sub(1);
        });
  }

  /// Collects the futures and waits for the device to catch up (bounds the queued messages).
  void settle() {
    for (auto& [size, f] : reserves_) {
      try {
        memory_handle h = f.get();
        t_.reserves.fetch_add(1, std::memory_order_relaxed);
        slot& s = slots_[rng_() % slots_.size()];
        drop(s);
        s.h = std::move(h);
        s.size = size;
        s.seed = rng_();
        // Written with write() rather than a submit, then checked like the others.
        std::vector<std::byte> bytes(size);
        fill(bytes.data(), size, s.seed);
        t_.outstanding.fetch_add(1);
        c_.write(s.h.binding(), std::move(bytes), [&t = t_](error_code ec) {
          if (ec) t.error("write: " + ec.message());
          t.outstanding.fetch_sub(1);
        });
        s.written = true;
      } catch (const std::exception& e) {
        t_.error(std::string("reserve: ") + e.what());
      }
    }
    reserves_.clear();
    for (auto& [seed, f] : reads_) {
      try {
        auto bytes = f.get();
        if (!holds(bytes.data(), bytes.size(), seed)) t_.failures.fetch_add(1);
        t_.reads.fetch_add(1, std::memory_order_relaxed);
      } catch (const std::exception& e) {
        t_.error(std::string("read: ") + e.what());
      }
    }
    reads_.clear();
    c_.submit({}, [](submit_context&) {}).get();
  }

  compute_client c_;
  tally& t_;
  std::mt19937_64 rng_;
  unsigned index_;
  std::vector<slot> slots_;
  std::vector<std::pair<std::uint64_t, std::future<memory_handle>>> reserves_;
  std::vector<std::pair<std::uint64_t, std::future<std::vector<std::byte>>>> reads_;
};

TEST(Stress, SixteenThreadsMixedOperationsKeepDataIntact) {
  runtime rt(quiet_options());
  compute_client c = rt.host();
  tally t;
  constexpr unsigned threads = 16;
  const std::uint64_t ops = ops_per_thread();
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (unsigned i = 0; i < threads; ++i) {
    pool.emplace_back([&, i] {
      worker w(c, t, i);
      w.run(ops);
    });
  }
  for (auto& th : pool) th.join();
  ASSERT_TRUE(devrt_test::wait_until([&] { return t.outstanding.load() == 0; }))
      << t.outstanding.load() << " callbacks never ran";
  const auto elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto processed = c.actor()->messages_processed();
  const auto drains = c.actor()->drains();
  std::printf(
      "[ stress   ] %u threads x %llu ops: %.2f s; %llu creates, %llu reserves, %llu drops, %llu copies, "
      "%llu pattern writes, %llu checks, %llu reads; %llu messages in %llu drains\n",
      threads, static_cast<unsigned long long>(ops), elapsed, static_cast<unsigned long long>(t.creates.load()),
      static_cast<unsigned long long>(t.reserves.load()), static_cast<unsigned long long>(t.drops.load()),
      static_cast<unsigned long long>(t.copies.load()), static_cast<unsigned long long>(t.writes.load()),
      static_cast<unsigned long long>(t.checks.load()), static_cast<unsigned long long>(t.reads.load()),
      static_cast<unsigned long long>(processed), static_cast<unsigned long long>(drains));

  EXPECT_EQ(t.errors.load(), 0u) << "first error: " << t.first_error;
  EXPECT_EQ(t.failures.load(), 0u) << "pattern checks failed: memory was shared or overwritten";
  EXPECT_GT(t.checks.load(), ops) << "too few checks ran for the test to mean anything";
  EXPECT_GT(t.reads.load(), ops / 100);
  EXPECT_GT(t.reserves.load(), ops / 2);

  const auto u = c.memory_usage().get();
  EXPECT_EQ(u.bytes_in_use, 0u);
  EXPECT_EQ(u.number_allocs, 0u);
  EXPECT_EQ(c.check_invariants().get(), "");
  const auto s = c.statistics().get();
  EXPECT_EQ(s.bytes_in_use, 0u);
  EXPECT_EQ(s.failed_reserves, 0u);
  EXPECT_EQ(s.reserves, t.creates.load() + t.reserves.load());
  c.cleanup().get();
  EXPECT_EQ(c.memory_usage().get().bytes_reserved, 0u);
  EXPECT_EQ(c.check_invariants().get(), "");
}

TEST(Stress, PostingWhileAnotherThreadShutsDown) {
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    auto rt = std::make_unique<runtime>(quiet_options());
    compute_client c = rt->host();
    std::atomic<bool> stopped{false};
    std::atomic<std::uint64_t> posted_callbacks{0};
    std::atomic<std::uint64_t> completed_callbacks{0};
    std::atomic<std::uint64_t> values{0};
    std::atomic<std::uint64_t> shutdowns{0};
    std::atomic<std::uint64_t> wrong{0};
    std::atomic<std::uint64_t> broken{0};
    std::vector<memory_handle> survivors[8];
    std::vector<std::thread> threads;
    for (int i = 0; i < 8; ++i) {
      threads.emplace_back([&, i] {
        std::mt19937 rng(static_cast<unsigned>(i + round * 100));
        std::vector<std::future<memory_handle>> reserves;
        std::vector<std::future<devrt::memory::resource>> resources;
        std::vector<std::future<int>> submits;
        auto judge = [&](auto& futures) {
          for (auto& f : futures) {
            try {
              if constexpr (std::is_same_v<std::decay_t<decltype(f.get())>, memory_handle>) {
                memory_handle h = f.get();
                if (rng() % 8 == 0) survivors[i].push_back(std::move(h));
              } else {
                (void)f.get();
              }
              values.fetch_add(1);
            } catch (const boost::system::system_error& e) {
              (e.code() == errc::shutdown ? shutdowns : wrong).fetch_add(1);
            } catch (const std::future_error&) {
              broken.fetch_add(1);
            } catch (...) {
              wrong.fetch_add(1);
            }
          }
          futures.clear();
        };
        // Keep posting until well after the shutdown.
        std::uint64_t after = 0;
        for (std::uint64_t n = 0; after < 2000; ++n) {
          if (stopped.load()) ++after;
          switch (rng() % 5) {
            case 0: reserves.push_back(c.reserve(1 + rng() % 4096)); break;
            case 1: {
              memory_handle h = c.create(1 + rng() % 4096);
              resources.push_back(c.get_resource(h.binding()));
              if (rng() % 8 == 0) survivors[i].push_back(h);
              break;
            }
            case 2: {
              memory_handle h = c.create(64);
              submits.push_back(c.submit({h.binding()}, [](submit_context& ctx) {
                std::memset(ctx.resources[0].ptr, 1, 64);
                return 1;
              }));
              break;
            }
            case 3:
              posted_callbacks.fetch_add(1);
              c.reserve(128, [&](error_code ec, memory_handle) {
                if (ec && ec != errc::shutdown) wrong.fetch_add(1);
                completed_callbacks.fetch_add(1);
              });
              break;
            default: {
              auto scope = c.persistent();
              reserves.push_back(c.reserve(32));
              break;
            }
          }
          if (n % 64 == 63) {
            judge(reserves);
            judge(resources);
            judge(submits);
          }
        }
        judge(reserves);
        judge(resources);
        judge(submits);
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(30 + 20 * round));
    rt->shutdown();
    stopped = true;
    for (auto& th : threads) th.join();
    EXPECT_TRUE(devrt_test::wait_until([&] { return completed_callbacks.load() == posted_callbacks.load(); },
                                       std::chrono::seconds(10)))
        << completed_callbacks.load() << " of " << posted_callbacks.load() << " callbacks ran";
    EXPECT_EQ(broken.load(), 0u) << "a future was abandoned (broken promise)";
    EXPECT_EQ(wrong.load(), 0u) << "an operation failed with something other than errc::shutdown";
    EXPECT_GT(values.load(), 0u) << "nothing was served before the shutdown";
    EXPECT_GT(shutdowns.load(), 0u) << "nothing was refused after the shutdown";
    // Handles that outlive the shutdown, and then the runtime, can be copied and dropped.
    std::vector<memory_handle> copies;
    for (auto& v : survivors) {
      for (auto& h : v) copies.push_back(h);
    }
    for (auto& v : survivors) v.clear();
    rt.reset();
    copies.clear();
  }
}

}  // namespace
