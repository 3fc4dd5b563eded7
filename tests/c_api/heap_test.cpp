// The C interface's hot path allocates nothing on the heap once warm: every operator new of the
// process is counted (this program replaces it) while threads allocate and free through
// devrt_malloc / devrt_free on the host device. Its own program, so that the counting replaces
// operator new nowhere else.
#include "devrt/c_api.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>
#include <thread>
#include <vector>

namespace {
std::atomic<std::uint64_t> news{0};
}  // namespace

void* operator new(std::size_t n) {
  news.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n != 0 ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t /*n*/) noexcept { std::free(p); }

namespace {

std::string last() { return devrt_last_error(); }

/// Allocates and frees `pairs` times, up to `held` pointers live at once.
void churn(int pairs, int held) {
  static constexpr std::size_t sizes[] = {4096, 300, 65536, 1 << 20, 24, 8 << 20, 0};
  std::vector<void*> live(static_cast<std::size_t>(held), nullptr);
  for (int i = 0; i < pairs; ++i) {
    void*& p = live[static_cast<std::size_t>(i % held)];
    if (p != nullptr) {
      ASSERT_EQ(devrt_free(p, DEVRT_HOST_DEVICE, nullptr), DEVRT_SUCCESS) << last();
    }
    ASSERT_EQ(devrt_malloc(&p, sizes[static_cast<std::size_t>(i) % std::size(sizes)], DEVRT_HOST_DEVICE, nullptr),
              DEVRT_SUCCESS)
        << last();
  }
  for (void* p : live) ASSERT_EQ(devrt_free(p, DEVRT_HOST_DEVICE, nullptr), DEVRT_SUCCESS) << last();
}

class CApiHeap : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(devrt_shutdown(), DEVRT_SUCCESS);
    devrt_options o;
    devrt_options_default(&o);
    o.use_cuda = 0;
    o.use_environment = 0;
    ASSERT_EQ(devrt_init(&o), DEVRT_SUCCESS) << last();
  }
  void TearDown() override { EXPECT_EQ(devrt_shutdown(), DEVRT_SUCCESS) << last(); }
};

TEST_F(CApiHeap, OneThreadAllocatesNothingOnTheHeapOnceWarm) {
  churn(4000, 8);  // warm: the pools, the pointer table and the future states
  const std::uint64_t before = news.load();
  churn(20000, 8);
  const std::uint64_t per_thousand = (news.load() - before) * 1000 / 20000;
  EXPECT_EQ(per_thousand, 0U) << news.load() - before << " operator new calls in 20000 malloc + free pairs";
}

TEST_F(CApiHeap, FourThreadsAllocateNothingOnTheHeapOnceWarm) {
  const auto run = [](int pairs) {
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t) ts.emplace_back([pairs] { churn(pairs, 4); });
    for (auto& t : ts) t.join();
  };
  run(4000);
  // Threads are new: each warms its own few future states. Beyond that, at most one operator new
  // per hundred pairs (a state that another thread dropped last, the table growing).
  const std::uint64_t before = news.load();
  run(20000);
  const std::uint64_t made = news.load() - before;
  EXPECT_LE(made, 4U * 20000 / 100) << made << " operator new calls in 4 x 20000 malloc + free pairs";
}

}  // namespace
