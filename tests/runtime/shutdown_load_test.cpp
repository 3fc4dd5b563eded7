// The runtime destroyed while 16 threads keep posting every kind of request to it (host and sim
// devices): nothing crashes or leaks (the asan preset runs this with leak detection), every request
// is answered exactly once — with its value if it was served, with errc::shutdown otherwise, never
// with a broken promise or a lost callback — and handles that outlive the runtime can still be
// copied and dropped.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <future>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "devrt/runtime/runtime.hpp"
#include "runtime_test_util.hpp"

namespace {

using boost::system::error_code;
using devrt::errc;
using devrt::devices::sim_options;
using devrt::memory::memory_handle;
using devrt::memory::preset;
using devrt::runtime::compute_client;
using devrt::runtime::device_graph;
using devrt::runtime::runtime;
using devrt::runtime::runtime_options;
using devrt::runtime::submit_context;

/// Outcomes of the requests of every thread.
struct outcome {
  std::atomic<std::uint64_t> served{0};      // completed with a value
  std::atomic<std::uint64_t> shut_down{0};   // completed with errc::shutdown
  std::atomic<std::uint64_t> legitimate{0};  // an error the request may have in any case
  std::atomic<std::uint64_t> wrong{0};       // any other error
  std::atomic<std::uint64_t> broken{0};      // a future whose promise was abandoned
  std::atomic<std::uint64_t> callbacks_posted{0};
  std::atomic<std::uint64_t> callbacks_run{0};
  std::atomic<std::uint64_t> posted_after{0};  // requests posted after the destruction began
  std::mutex mutex;
  std::string first_wrong;

  void judge(const error_code& ec, std::initializer_list<errc> allowed = {}) {
    if (!ec) {
      served.fetch_add(1, std::memory_order_relaxed);
    } else if (ec == errc::shutdown) {
      shut_down.fetch_add(1, std::memory_order_relaxed);
    } else {
      for (errc a : allowed) {
        if (ec == a) {
          legitimate.fetch_add(1, std::memory_order_relaxed);
          return;
        }
      }
      wrong.fetch_add(1, std::memory_order_relaxed);
      std::lock_guard lock(mutex);
      if (first_wrong.empty()) first_wrong = ec.message();
    }
  }

  template <class Future>
  void judge_future(Future& f, std::initializer_list<errc> allowed = {}) {
    try {
      f.get();
      judge({});
    } catch (const boost::system::system_error& e) {
      judge(e.code(), allowed);
    } catch (const std::future_error&) {
      broken.fetch_add(1, std::memory_order_relaxed);
    } catch (const std::exception& e) {
      wrong.fetch_add(1, std::memory_order_relaxed);
      std::lock_guard lock(mutex);
      if (first_wrong.empty()) first_wrong = e.what();
    }
  }
};

/// One client thread: posts mixed requests until told to stop, judging its futures in batches.
void client_loop(compute_client c, bool data, unsigned seed, outcome& out, const std::atomic<bool>& destroyed,
                 std::vector<memory_handle>& survivors) {
  std::mt19937 rng(seed);
  std::vector<std::future<memory_handle>> reserves;
  std::vector<std::future<devrt::memory::resource>> resources;
  std::vector<std::future<void>> voids;
  std::vector<std::future<std::vector<std::byte>>> reads;
  std::vector<std::future<device_graph>> graphs;
  std::vector<std::future<int>> submits;
  auto judge_all = [&] {
    for (auto& f : reserves) {
      try {
        memory_handle h = f.get();
        out.judge({});
        if (rng() % 16 == 0) survivors.push_back(std::move(h));
      } catch (const boost::system::system_error& e) {
        out.judge(e.code());
      } catch (const std::future_error&) {
        out.broken.fetch_add(1);
      }
    }
    reserves.clear();
    for (auto& f : resources) out.judge_future(f);
    resources.clear();
    // capture_end may find no window (another thread closed it): no_capture is legitimate.
    for (auto& f : graphs) out.judge_future(f, {errc::no_capture});
    graphs.clear();
    // configure during another thread's capture window is refused: capture_active is legitimate.
    for (auto& f : voids) out.judge_future(f, {errc::capture_active});
    voids.clear();
    for (auto& f : reads) out.judge_future(f);
    reads.clear();
    for (auto& f : submits) out.judge_future(f);
    submits.clear();
  };
  std::uint64_t after = 0;
  for (std::uint64_t n = 0; after < 1500; ++n) {
    if (destroyed.load(std::memory_order_acquire)) {
      ++after;
      out.posted_after.fetch_add(1, std::memory_order_relaxed);
    }
    switch (rng() % 12) {
      case 0:
      case 1: reserves.push_back(c.reserve(1 + rng() % 8192)); break;
      case 2: {
        memory_handle h = c.create(1 + rng() % 8192);
        resources.push_back(c.get_resource(h.binding()));
        if (rng() % 8 == 0) survivors.push_back(std::move(h));
        break;
      }
      case 3: {
        memory_handle h = c.create(256);
        if (data) {
          voids.push_back(c.write(h.binding(), std::vector<std::byte>(256, std::byte{7})));
          reads.push_back(c.read(h.binding()));
        } else {
          resources.push_back(c.get_resource(h.binding(), 16, 16, boost::asio::use_future));
        }
        break;
      }
      case 4: {
        memory_handle h = c.create(64);
        submits.push_back(c.submit({h.binding()}, [data](submit_context& ctx) {
          if (data) std::memset(ctx.resources[0].ptr, 1, 64);
          return static_cast<int>(ctx.resources[0].size);
        }));
        break;
      }
      case 5:
        out.callbacks_posted.fetch_add(1, std::memory_order_relaxed);
        c.reserve(128, [&out](error_code ec, memory_handle) {
          out.judge(ec);
          out.callbacks_run.fetch_add(1, std::memory_order_release);  // the test waits for it
        });
        break;
      case 6:
        out.callbacks_posted.fetch_add(1, std::memory_order_relaxed);
        c.cleanup([&out](error_code ec) {
          out.judge(ec);
          out.callbacks_run.fetch_add(1, std::memory_order_release);  // the test waits for it
        });
        break;
      case 7: {
        auto scope = c.persistent();
        reserves.push_back(c.reserve(32 + rng() % 256));
        break;
      }
      case 8:
        if (rng() % 8 == 0) {
          voids.push_back(c.capture_begin());
          reserves.push_back(c.reserve(512));
          graphs.push_back(c.capture_end());
        } else {
          reserves.push_back(c.reserve(2048));
        }
        break;
      case 9:
        if (rng() % 16 == 0) {
          out.callbacks_posted.fetch_add(1, std::memory_order_relaxed);
          c.configure(rng() % 2 == 0 ? preset::exclusive_pages : preset::sub_slices,
                      [&out](error_code ec, devrt::memory::configure_outcome) {
                        out.judge(ec, {errc::capture_active});
                        out.callbacks_run.fetch_add(1, std::memory_order_release);  // the test waits for it
                      });
        }
        break;
      case 10: {
        auto f = c.statistics();
        try {
          (void)f.get();
          out.judge({});
        } catch (const boost::system::system_error& e) {
          out.judge(e.code());
        }
        break;
      }
      default:
        if (!survivors.empty()) survivors.pop_back();  // drops race the destruction too
        break;
    }
    if (n % 48 == 47) judge_all();
  }
  judge_all();
}

struct scenario {
  const char* name;
  bool sim;
  int delay_ms;
  bool block_strand;  // a long submit holds the strand so that requests queue up behind it
};

class ShutdownUnderLoad : public ::testing::TestWithParam<scenario> {};

TEST_P(ShutdownUnderLoad, EveryRequestIsAnsweredAndNothingLeaks) {
  const scenario& s = GetParam();
  runtime_options o = devrt_test::quiet_options();
  if (s.sim) o.sim = sim_options{};
  auto rt = std::make_unique<runtime>(o);
  compute_client c = s.sim ? rt->sim() : rt->host();
  outcome out;
  std::atomic<bool> destroyed{false};
  constexpr unsigned threads = 16;
  std::vector<std::vector<memory_handle>> survivors(threads);
  std::promise<void> gate;
  std::shared_future<void> open = gate.get_future().share();
  std::future<int> blocker;
  if (s.block_strand) {
    blocker = c.submit({}, [open](submit_context&) {
      open.wait_for(std::chrono::seconds(30));
      return 1;
    });
  }
  std::vector<std::thread> pool;
  for (unsigned i = 0; i < threads; ++i) {
    pool.emplace_back([&, i] { client_loop(c, !s.sim, 1000 + i, out, destroyed, survivors[i]); });
  }
  if (!s.block_strand) {
    // Under a loaded machine (sanitizers, parallel tests) a few milliseconds may pass before the
    // first request is served: the destruction comes once one has been.
    EXPECT_TRUE(devrt_test::wait_until([&] { return out.served.load() > 0; })) << "no request was ever served";
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(s.delay_ms));
  if (s.block_strand) {
    // Release the strand from another thread once the destruction has begun.
    std::thread opener([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      gate.set_value();
    });
    destroyed.store(true, std::memory_order_release);
    rt.reset();
    opener.join();
  } else {
    destroyed.store(true, std::memory_order_release);
    rt.reset();  // the destructor shuts every actor down while the threads keep posting
  }
  for (auto& t : pool) t.join();
  if (s.block_strand) {
    EXPECT_EQ(blocker.get(), 1) << "the request being served when the destruction began finishes";
  }
  EXPECT_TRUE(devrt_test::wait_until([&] { return out.callbacks_run.load() == out.callbacks_posted.load(); },
                                     std::chrono::seconds(30)))
      << out.callbacks_run.load() << " of " << out.callbacks_posted.load() << " callbacks ran";
  std::printf(
      "[ shutdown ] %s: %llu served, %llu answered with shutdown, %llu legitimate errors, %llu posted after "
      "the destruction began\n",
      s.name, static_cast<unsigned long long>(out.served.load()), static_cast<unsigned long long>(out.shut_down.load()),
      static_cast<unsigned long long>(out.legitimate.load()), static_cast<unsigned long long>(out.posted_after.load()));
  EXPECT_EQ(out.broken.load(), 0u) << "a future was abandoned (broken promise)";
  EXPECT_EQ(out.wrong.load(), 0u) << "first unexpected error: " << out.first_wrong;
  EXPECT_GT(out.shut_down.load(), 0u) << "nothing was answered with shutdown";
  EXPECT_GE(out.posted_after.load(), threads * 1500u);
  if (!s.block_strand) {
    EXPECT_GT(out.served.load(), 0u) << "nothing was served before the destruction";
  }
  // Handles that outlive the runtime: copies and drops from several threads.
  std::vector<std::thread> droppers;
  for (auto& v : survivors) {
    droppers.emplace_back([&v] {
      std::vector<memory_handle> copies(v.begin(), v.end());
      v.clear();
      copies.clear();
    });
  }
  for (auto& t : droppers) t.join();
}

INSTANTIATE_TEST_SUITE_P(Scenarios, ShutdownUnderLoad,
                         ::testing::Values(scenario{"host_early", false, 5, false},
                                           scenario{"host_under_load", false, 60, false},
                                           scenario{"sim_under_load", true, 40, false},
                                           scenario{"host_strand_blocked", false, 20, true},
                                           scenario{"sim_strand_blocked", true, 20, true}),
                         [](const ::testing::TestParamInfo<scenario>& p) { return std::string(p.param.name); });

}  // namespace
