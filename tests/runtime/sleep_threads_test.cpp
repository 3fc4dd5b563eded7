// Sleep and wake through the actor while 16 client threads allocate, write, check and free under
// other tags (and none) on the same device: the sleeping tag's bytes come back at the same
// addresses after every round, the other threads' memory is never disturbed, and every pool stays
// consistent.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "devrt/runtime/runtime.hpp"
#include "runtime_test_util.hpp"

using namespace devrt;
using devrt::memory::memory_handle;
using devrt::runtime::actor_core;
using devrt::runtime::compute_client;

using devrt::runtime::tag_scope;
using devrt::runtime::use_future_t;

namespace {

constexpr std::uint64_t mib = 1ULL << 20;

void fill(void* p, std::uint64_t n, unsigned char v) { std::memset(p, v, n); }

bool holds(const void* p, std::uint64_t n, unsigned char v) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::uint64_t i = 0; i < n; i += 4093) {
    if (b[i] != v) return false;
  }
  return n == 0 || b[n - 1] == v;
}

}  // namespace

TEST(SleepThreads, SixteenThreadsAllocateOtherTagsDuringSleepAndWake) {
  devrt::runtime::runtime rt(devrt_test::quiet_options());
  compute_client c = rt.host();
  const memory::tag_name model("threads.model");
  std::vector<memory_handle> weights;
  std::vector<void*> at;
  for (int i = 0; i < 8; ++i) {
    weights.push_back(c.reserve(3 * mib + static_cast<std::uint64_t>(i) * 4096, memory::stream(), model).get());
    fill(weights.back().ptr(), weights.back().size(), static_cast<unsigned char>(i + 1));
    at.push_back(weights.back().ptr());
  }

  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};
  std::atomic<std::uint64_t> served{0};
  std::vector<std::string> errors(16);
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&, t] {
      // Half the threads tag their memory (a tag each, some shared), half use none.
      const std::string name = "threads.worker" + std::to_string(t % 4);
      std::optional<tag_scope> scope;
      if (t % 2 == 0) scope.emplace(name);
      std::vector<memory_handle> mine;
      unsigned char v = static_cast<unsigned char>(t + 17);
      try {
        while (!stop.load(std::memory_order_relaxed) || served.load() < 16 * 50) {
          const std::uint64_t size = 4096 * (1 + (v * 7) % 64);
          mine.push_back(c.reserve(size).get());
          fill(mine.back().ptr(), size, v);
          if (mine.size() > 6) {
            if (!holds(mine.front().ptr(), mine.front().size(), static_cast<unsigned char>(v - 6))) {
              errors[static_cast<std::size_t>(t)] = "a worker's bytes changed under it";
              failures.fetch_add(1);
              return;
            }
            mine.erase(mine.begin());
          }
          ++v;
          served.fetch_add(1);
        }
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(t)] = e.what();
        failures.fetch_add(1);
      }
    });
  }

  for (int round = 0; round < 12; ++round) {
    const bool keep = round % 3 != 2;
    c.sleep(model.view(), keep).get();
    bool asleep = false;
    for (const auto& u : c.tags().get()) {
      if (u.name == model.view()) asleep = u.state == memory::tag_state::asleep;
    }
    EXPECT_TRUE(asleep) << "round " << round;
    c.wake(model.view()).get();
    for (std::size_t i = 0; i < weights.size(); ++i) {
      ASSERT_EQ(weights[i].ptr(), at[i]) << "round " << round;
      if (keep) {
        EXPECT_TRUE(holds(weights[i].ptr(), weights[i].size(), static_cast<unsigned char>(i + 1)))
            << "round " << round << ", allocation " << i << ": the kept bytes";
      } else {
        fill(weights[i].ptr(), weights[i].size(), static_cast<unsigned char>(i + 1));  // reloaded
      }
    }
  }
  stop.store(true);
  for (auto& th : threads) th.join();
  for (std::size_t t = 0; t < errors.size(); ++t) EXPECT_EQ(errors[t], "") << "thread " << t;
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GE(served.load(), 16u * 50);
  const std::string problem =
      c.async_run<std::string>([](actor_core& a) { return result<std::string>(a.manager().check_invariants()); },
                               use_future_t{})
          .get();
  EXPECT_EQ(problem, "");
  const memory::memory_statistics st = c.statistics().get();
  EXPECT_EQ(st.sleeps, 12u);
  EXPECT_EQ(st.wakes, 12u);
  EXPECT_GT(st.bytes_host_cached, 0u) << "the last kept copy is cached for the next sleep";
  EXPECT_EQ(c.release_host_copies().get(), st.bytes_host_cached);
}
