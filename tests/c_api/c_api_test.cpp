// The C interface on the host device, through devrt/c_api.h alone (the program links only
// libdevrt_c.so): threads allocating, writing, checking and freeing; exact statistics; peak reset;
// empty cache; configure; every bad input with its code, its message and no effect; zero sizes;
// streams; the PyTorch entry points.
#include "devrt/c_api.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int host = DEVRT_HOST_DEVICE;

std::string last() { return devrt_last_error(); }

std::string pointer_text(const void* p) {
  char buf[32];
  (void)std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

devrt_stats stats(int device = host) {
  devrt_stats s{};
  EXPECT_EQ(devrt_get_stats(device, &s), DEVRT_SUCCESS) << last();
  return s;
}

/// The parts of the statistics that a rejected call must leave as they were.
void expect_same_memory(const devrt_stats& a, const devrt_stats& b) {
  EXPECT_EQ(a.in_use_bytes, b.in_use_bytes);
  EXPECT_EQ(a.reserved_bytes, b.reserved_bytes);
  EXPECT_EQ(a.live_allocations, b.live_allocations);
  EXPECT_EQ(a.allocations, b.allocations);
  EXPECT_EQ(a.frees, b.frees);
  EXPECT_EQ(a.driver_allocs, b.driver_allocs);
  EXPECT_EQ(a.driver_frees, b.driver_frees);
}

/// After a rejected call: an allocation still works.
void expect_allocation_works() {
  void* p = nullptr;
  ASSERT_EQ(devrt_malloc(&p, 4096, host, nullptr), DEVRT_SUCCESS) << last();
  std::memset(p, 0x5a, 4096);
  EXPECT_EQ(devrt_free(p, host, nullptr), DEVRT_SUCCESS) << last();
}

std::uint8_t pattern(std::uint64_t tag, std::size_t i) {
  return static_cast<std::uint8_t>((tag * 0x9E3779B97F4A7C15ULL + i * 131U) >> 56);
}

/// Every test starts devrt afresh on the host device only, without the environment.
class CApi : public ::testing::Test {
 protected:
  void SetUp() override { start(0); }
  void TearDown() override { EXPECT_EQ(devrt_shutdown(), DEVRT_SUCCESS) << last(); }

  static void start(std::uint64_t host_capacity) {
    ASSERT_EQ(devrt_shutdown(), DEVRT_SUCCESS);
    devrt_options o;
    devrt_options_default(&o);
    o.use_cuda = 0;
    o.use_environment = 0;
    o.host_capacity = host_capacity;
    ASSERT_EQ(devrt_init(&o), DEVRT_SUCCESS) << last();
  }
};

TEST_F(CApi, EightThreadsAllocateWriteCheckAndFreeThousandsOfTimes) {
  constexpr int threads = 8;
  constexpr int iterations = 3000;
  constexpr std::size_t window = 16;  // allocations each thread keeps live at once
  const devrt_stats before = stats();
  std::vector<std::thread> pool;
  std::vector<std::string> failures(threads);
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([t, &failures] {
      struct live {
        void* p;
        std::size_t size;
        std::uint64_t tag;
        void* stream;
      };
      std::mt19937_64 rng(static_cast<std::uint64_t>(t) + 1);
      std::vector<live> held;
      // Streams: devrt's own, the legacy and per-thread default streams, and one of this thread's.
      void* streams[] = {nullptr, DEVRT_STREAM_LEGACY, DEVRT_STREAM_PER_THREAD,
                         reinterpret_cast<void*>(static_cast<std::uintptr_t>(0x10000 + 0x100 * t))};
      const auto check_and_free = [&](const live& l) {
        const auto* bytes = static_cast<const std::uint8_t*>(l.p);
        for (std::size_t i = 0; i < l.size; ++i) {
          if (bytes[i] != pattern(l.tag, i)) {
            failures[static_cast<std::size_t>(t)] =
                "byte " + std::to_string(i) + " of allocation " + std::to_string(l.tag) + " was overwritten";
            return false;
          }
        }
        if (devrt_free(l.p, host, l.stream) != DEVRT_SUCCESS) {
          failures[static_cast<std::size_t>(t)] = "free: " + last();
          return false;
        }
        return true;
      };
      for (int i = 0; i < iterations; ++i) {
        const std::uint64_t r = rng();
        // Mostly small sizes, sometimes zero, sometimes up to 1 MiB.
        const std::size_t size = (r % 64 == 0) ? 0 : (r % 16 == 0) ? (r >> 8) % (1 << 20) : (r >> 8) % 4096;
        void* stream = streams[(r >> 40) % 4];
        live l{nullptr, size, (static_cast<std::uint64_t>(t) << 32) | static_cast<std::uint64_t>(i), stream};
        if (devrt_malloc(&l.p, size, host, stream) != DEVRT_SUCCESS) {
          failures[static_cast<std::size_t>(t)] = "malloc: " + last();
          return;
        }
        auto* bytes = static_cast<std::uint8_t*>(l.p);
        for (std::size_t k = 0; k < size; ++k) bytes[k] = pattern(l.tag, k);
        held.push_back(l);
        if (held.size() > window) {
          const std::size_t victim = (r >> 48) % held.size();
          if (!check_and_free(held[victim])) return;
          held[victim] = held.back();
          held.pop_back();
        }
      }
      for (const live& l : held) {
        if (!check_and_free(l)) return;
      }
    });
  }
  for (auto& th : pool) th.join();
  for (int t = 0; t < threads; ++t) EXPECT_EQ(failures[static_cast<std::size_t>(t)], "") << "thread " << t;

  const devrt_stats after = stats();
  EXPECT_EQ(after.allocations - before.allocations, std::uint64_t{threads} * iterations);
  EXPECT_EQ(after.frees - before.frees, std::uint64_t{threads} * iterations);
  EXPECT_EQ(after.live_allocations, 0U);
  EXPECT_EQ(after.in_use_bytes, 0U);
  EXPECT_EQ(after.failed_allocations, 0U);
  EXPECT_GE(after.peak_in_use_bytes, 1U);
}

TEST_F(CApi, StatisticsAreExactBeforeAndAfter) {
  const devrt_stats s0 = stats();
  EXPECT_EQ(s0.in_use_bytes, 0U);
  EXPECT_EQ(s0.live_allocations, 0U);
  void* a = nullptr;
  void* b = nullptr;
  ASSERT_EQ(devrt_malloc(&a, 1000, host, nullptr), DEVRT_SUCCESS) << last();
  ASSERT_EQ(devrt_malloc(&b, 3000, host, nullptr), DEVRT_SUCCESS) << last();
  const devrt_stats s1 = stats();
  EXPECT_EQ(s1.in_use_bytes, 4000U);
  EXPECT_EQ(s1.live_allocations, 2U);
  EXPECT_EQ(s1.allocations, s0.allocations + 2);
  EXPECT_EQ(s1.frees, s0.frees);
  EXPECT_GE(s1.reserved_bytes, 4000U);
  EXPECT_EQ(s1.peak_in_use_bytes, 4000U);

  size_t size = 0;
  ASSERT_EQ(devrt_allocation_size(b, &size), DEVRT_SUCCESS) << last();
  EXPECT_EQ(size, 3000U);

  ASSERT_EQ(devrt_free(a, host, nullptr), DEVRT_SUCCESS) << last();
  const devrt_stats s2 = stats();
  EXPECT_EQ(s2.in_use_bytes, 3000U);
  EXPECT_EQ(s2.live_allocations, 1U);
  EXPECT_EQ(s2.frees, s0.frees + 1);
  EXPECT_EQ(s2.peak_in_use_bytes, 4000U);

  ASSERT_EQ(devrt_free(b, host, nullptr), DEVRT_SUCCESS) << last();
  const devrt_stats s3 = stats();
  EXPECT_EQ(s3.in_use_bytes, 0U);
  EXPECT_EQ(s3.live_allocations, 0U);
  EXPECT_EQ(s3.allocations, s0.allocations + 2);
  EXPECT_EQ(s3.frees, s0.frees + 2);
}

TEST_F(CApi, PeakResetDropsThePeaksToTheCurrentValues) {
  void* big = nullptr;
  void* small = nullptr;
  ASSERT_EQ(devrt_malloc(&big, 8 << 20, host, nullptr), DEVRT_SUCCESS) << last();
  ASSERT_EQ(devrt_malloc(&small, 100, host, nullptr), DEVRT_SUCCESS) << last();
  ASSERT_EQ(devrt_free(big, host, nullptr), DEVRT_SUCCESS) << last();
  const devrt_stats before = stats();
  EXPECT_EQ(before.peak_in_use_bytes, (8U << 20) + 100U);

  ASSERT_EQ(devrt_reset_peak_stats(host), DEVRT_SUCCESS) << last();
  const devrt_stats after = stats();
  EXPECT_EQ(after.peak_in_use_bytes, 100U);
  EXPECT_EQ(after.peak_reserved_bytes, after.reserved_bytes);
  EXPECT_EQ(after.allocations, before.allocations);  // counters are kept

  void* more = nullptr;
  ASSERT_EQ(devrt_malloc(&more, 1000, host, nullptr), DEVRT_SUCCESS) << last();
  EXPECT_EQ(stats().peak_in_use_bytes, 1100U);
  EXPECT_EQ(devrt_free(more, host, nullptr), DEVRT_SUCCESS);
  EXPECT_EQ(devrt_free(small, host, nullptr), DEVRT_SUCCESS);
  EXPECT_EQ(devrt_reset_peak_stats(7), DEVRT_ERROR_INVALID_DEVICE);
}

TEST_F(CApi, EmptyCacheReturnsUnusedMemoryToTheDriver) {
  std::vector<void*> ps(8);
  for (void*& p : ps) ASSERT_EQ(devrt_malloc(&p, 4 << 20, host, nullptr), DEVRT_SUCCESS) << last();
  for (void* p : ps) ASSERT_EQ(devrt_free(p, host, nullptr), DEVRT_SUCCESS) << last();
  const devrt_stats before = stats();
  EXPECT_EQ(before.in_use_bytes, 0U);

  ASSERT_EQ(devrt_empty_cache(host), DEVRT_SUCCESS) << last();
  const devrt_stats after = stats();
  EXPECT_EQ(after.cleanups, before.cleanups + 1);
  EXPECT_EQ(after.reserved_bytes, 0U) << "reserved before: " << before.reserved_bytes;
  if (before.reserved_bytes > 0) {
    EXPECT_GT(after.driver_frees + after.unmaps, before.driver_frees + before.unmaps);
  }
  expect_allocation_works();
  EXPECT_EQ(devrt_empty_cache(-2), DEVRT_ERROR_INVALID_DEVICE);
}

TEST_F(CApi, ConfigureAppliesAGoodLayoutAndKeepsTheOldOneOnABadOne) {
  // A layout whose only pool takes 1 MiB at most: a 2 MiB request has no pool.
  ASSERT_EQ(devrt_configure(host, "exclusive:max=1MiB"), DEVRT_SUCCESS) << last();
  void* p = nullptr;
  EXPECT_EQ(devrt_malloc(&p, 2 << 20, host, nullptr), DEVRT_ERROR_NO_POOL);
  EXPECT_NE(last().find("2097152"), std::string::npos) << last();
  EXPECT_EQ(p, nullptr);

  EXPECT_EQ(devrt_configure(host, "sliced:page=0"), DEVRT_ERROR_INVALID_LAYOUT);
  EXPECT_NE(last().find("page_size"), std::string::npos) << last();
  EXPECT_NE(last().find("stays in force"), std::string::npos) << last();
  EXPECT_EQ(devrt_configure(host, "bogus-layout"), DEVRT_ERROR_INVALID_LAYOUT);
  EXPECT_NE(last().find("bogus-layout"), std::string::npos) << last();
  EXPECT_EQ(devrt_configure(host, nullptr), DEVRT_ERROR_INVALID_VALUE);

  // The 1 MiB layout is still in force.
  EXPECT_EQ(devrt_malloc(&p, 2 << 20, host, nullptr), DEVRT_ERROR_NO_POOL);
  ASSERT_EQ(devrt_malloc(&p, 512 << 10, host, nullptr), DEVRT_SUCCESS) << last();

  // Live memory keeps the layout too, and says how much is live.
  EXPECT_EQ(devrt_configure(host, "auto"), DEVRT_ERROR_BUSY);
  EXPECT_NE(last().find("524288 bytes"), std::string::npos) << last();
  ASSERT_EQ(devrt_free(p, host, nullptr), DEVRT_SUCCESS);

  ASSERT_EQ(devrt_configure(host, "auto"), DEVRT_SUCCESS) << last();
  ASSERT_EQ(devrt_malloc(&p, 2 << 20, host, nullptr), DEVRT_SUCCESS) << last();
  EXPECT_EQ(devrt_free(p, host, nullptr), DEVRT_SUCCESS);
  EXPECT_EQ(devrt_configure(5, "auto"), DEVRT_ERROR_INVALID_DEVICE);
}

TEST_F(CApi, EveryBadInputHasItsCodeAndMessageAndChangesNothing) {
  void* keep = nullptr;  // a live allocation the bad calls must leave alone
  ASSERT_EQ(devrt_malloc(&keep, 777, host, nullptr), DEVRT_SUCCESS) << last();
  const devrt_stats base = stats();

  // Runs a call that must fail: its code, its message naming the offending value, no effect on the
  // memory, and an allocation still works afterwards.
  const auto check = [&](auto call, int want, const std::string& needle) {
    const devrt_stats before = stats();
    const int got = call();
    EXPECT_EQ(got, want) << devrt_status_name(got) << ": " << last();
    EXPECT_NE(last().find(needle), std::string::npos) << "message: " << last() << "\nexpected to contain: " << needle;
    expect_same_memory(stats(), before);
    expect_allocation_works();
  };

  void* unknown = reinterpret_cast<void*>(static_cast<std::uintptr_t>(0x12345640));
  check([&] { return devrt_free(unknown, host, nullptr); }, DEVRT_ERROR_UNKNOWN_POINTER, pointer_text(unknown));

  void* once = nullptr;
  ASSERT_EQ(devrt_malloc(&once, 64, host, nullptr), DEVRT_SUCCESS);
  ASSERT_EQ(devrt_free(once, host, nullptr), DEVRT_SUCCESS);
  const devrt_stats base2 = stats();
  EXPECT_EQ(devrt_free(once, host, nullptr), DEVRT_ERROR_DOUBLE_FREE);
  EXPECT_NE(last().find(pointer_text(once)), std::string::npos) << last();
  expect_same_memory(stats(), base2);

  void* p = reinterpret_cast<void*>(static_cast<std::uintptr_t>(0xdead));
  const std::uint64_t too_big = (std::uint64_t{1} << 62) + 1;
  check([&] { return devrt_malloc(&p, too_big, host, nullptr); }, DEVRT_ERROR_SIZE_TOO_LARGE, std::to_string(too_big));
  EXPECT_EQ(p, nullptr);
  check([&] { return devrt_malloc(&p, std::numeric_limits<size_t>::max(), host, nullptr); }, DEVRT_ERROR_SIZE_TOO_LARGE,
        std::to_string(std::numeric_limits<size_t>::max()));

  check([&] { return devrt_malloc(&p, 100, 7, nullptr); }, DEVRT_ERROR_INVALID_DEVICE, "device 7");
  check([&] { return devrt_malloc(&p, 100, -2, nullptr); }, DEVRT_ERROR_INVALID_DEVICE, "device -2");
  check([&] { return devrt_free(keep, 3, nullptr); }, DEVRT_ERROR_INVALID_DEVICE,
        "device -1");  // keep's own device named

  check([&] { return devrt_malloc(nullptr, 100, host, nullptr); }, DEVRT_ERROR_INVALID_VALUE, "NULL");
  devrt_stats* no_stats = nullptr;
  EXPECT_EQ(devrt_get_stats(host, no_stats), DEVRT_ERROR_INVALID_VALUE);
  devrt_stats s{};
  check([&] { return devrt_get_stats(9, &s); }, DEVRT_ERROR_INVALID_DEVICE, "device 9");
  check([&] { return devrt_record_stream(unknown, nullptr); }, DEVRT_ERROR_UNKNOWN_POINTER, pointer_text(unknown));

  EXPECT_EQ(devrt_free(nullptr, host, nullptr), DEVRT_SUCCESS);  // as free(NULL)
  EXPECT_EQ(stats().live_allocations, base.live_allocations);
  EXPECT_EQ(stats().in_use_bytes, base.in_use_bytes);
  EXPECT_EQ(devrt_free(keep, host, nullptr), DEVRT_SUCCESS) << last();
}

TEST_F(CApi, OutOfMemoryNamesTheSizesAndChangesNothing) {
  start(64 << 20);  // a host device of 64 MiB
  void* keep = nullptr;
  ASSERT_EQ(devrt_malloc(&keep, 16 << 20, host, nullptr), DEVRT_SUCCESS) << last();
  const devrt_stats base = stats();
  void* p = nullptr;
  const int r = devrt_malloc(&p, 100 << 20, host, nullptr);
  EXPECT_TRUE(r == DEVRT_ERROR_OUT_OF_MEMORY || r == DEVRT_ERROR_NO_POOL) << devrt_status_name(r) << ": " << last();
  EXPECT_NE(last().find("104857600"), std::string::npos) << last();
  EXPECT_EQ(p, nullptr);
  const devrt_stats after = stats();
  expect_same_memory(after, base);
  EXPECT_EQ(after.failed_allocations, base.failed_allocations + 1);

  // Past the cap with room in the layout: the device itself refuses.
  std::vector<void*> held;
  int last_status = DEVRT_SUCCESS;
  for (int i = 0; i < 8 && last_status == DEVRT_SUCCESS; ++i) {
    void* q = nullptr;
    last_status = devrt_malloc(&q, 16 << 20, host, nullptr);
    if (last_status == DEVRT_SUCCESS) held.push_back(q);
  }
  EXPECT_EQ(last_status, DEVRT_ERROR_OUT_OF_MEMORY) << last();
  EXPECT_NE(last().find("16777216"), std::string::npos) << last();
  EXPECT_GE(stats().out_of_memory_errors, 1U);
  for (void* q : held) EXPECT_EQ(devrt_free(q, host, nullptr), DEVRT_SUCCESS);
  EXPECT_EQ(devrt_free(keep, host, nullptr), DEVRT_SUCCESS);
  expect_allocation_works();
}

TEST_F(CApi, ShutDownRefusesUntilInitAndInitRefusesWhileRunning) {
  devrt_options o;
  devrt_options_default(&o);
  o.use_cuda = 0;
  EXPECT_EQ(devrt_init(&o), DEVRT_ERROR_ALREADY_INITIALIZED);
  EXPECT_NE(last().find("already"), std::string::npos) << last();

  void* p = nullptr;
  ASSERT_EQ(devrt_malloc(&p, 100, host, nullptr), DEVRT_SUCCESS);
  ASSERT_EQ(devrt_shutdown(), DEVRT_SUCCESS);  // frees p too
  EXPECT_EQ(devrt_is_initialized(), 0);
  void* q = nullptr;
  EXPECT_EQ(devrt_malloc(&q, 100, host, nullptr), DEVRT_ERROR_NOT_INITIALIZED);
  EXPECT_NE(last().find("devrt_init"), std::string::npos) << last();
  EXPECT_EQ(devrt_free(p, host, nullptr), DEVRT_ERROR_NOT_INITIALIZED);
  devrt_stats s{};
  EXPECT_EQ(devrt_get_stats(host, &s), DEVRT_ERROR_NOT_INITIALIZED);
  EXPECT_EQ(devrt_configure(host, "auto"), DEVRT_ERROR_NOT_INITIALIZED);
  EXPECT_EQ(devrt_release_host_copies(host, nullptr), DEVRT_ERROR_NOT_INITIALIZED);
  EXPECT_EQ(devrt_set_memory_limit(host, 1), DEVRT_ERROR_NOT_INITIALIZED);
  size_t size = 0;
  EXPECT_EQ(devrt_allocation_size(p, &size), DEVRT_ERROR_NOT_INITIALIZED);
  EXPECT_NE(last().find("devrt_init"), std::string::npos) << last();

  o.host_layout = "sliced:page=0";
  EXPECT_EQ(devrt_init(&o), DEVRT_ERROR_INVALID_LAYOUT);
  EXPECT_NE(last().find("page_size"), std::string::npos) << last();
  o.host_layout = "nonsense";
  EXPECT_EQ(devrt_init(&o), DEVRT_ERROR_INVALID_LAYOUT);
  EXPECT_NE(last().find("nonsense"), std::string::npos) << last();
  o.host_layout = nullptr;
  o.log_level = "loud";
  EXPECT_EQ(devrt_init(&o), DEVRT_ERROR_INVALID_VALUE);
  EXPECT_NE(last().find("loud"), std::string::npos) << last();
  o.log_level = nullptr;
  o.version = 99;
  EXPECT_EQ(devrt_init(&o), DEVRT_ERROR_INVALID_VALUE);
  EXPECT_NE(last().find("99"), std::string::npos) << last();
  EXPECT_EQ(devrt_is_initialized(), 0);

  o.version = DEVRT_C_API_VERSION;
  ASSERT_EQ(devrt_init(&o), DEVRT_SUCCESS) << last();
  EXPECT_EQ(stats().live_allocations, 0U);
  expect_allocation_works();
}

// A malformed DEVRT_* variable is a bad value, not a bad layout, whichever call starts devrt.
TEST_F(CApi, AMalformedEnvironmentVariableIsAnInvalidValue) {
  ASSERT_EQ(devrt_shutdown(), DEVRT_SUCCESS);
  devrt_options o;
  devrt_options_default(&o);
  o.use_cuda = 0;
  o.use_environment = 1;
  for (const char* name :
       {"DEVRT_LOG_LEVEL", "DEVRT_MEMORY_LIMIT", "DEVRT_PERSISTENT_MEMORY", "DEVRT_SERVE_IN_PLACE"}) {
    ASSERT_EQ(setenv(name, "bogus", 1), 0);
    EXPECT_EQ(devrt_init(&o), DEVRT_ERROR_INVALID_VALUE) << name << ": " << last();
    EXPECT_NE(last().find("bogus"), std::string::npos) << name << ": " << last();
    EXPECT_EQ(devrt_is_initialized(), 0) << name;
    ASSERT_EQ(unsetenv(name), 0);
  }
  ASSERT_EQ(devrt_init(&o), DEVRT_SUCCESS) << last();  // TearDown shuts it down
}

TEST_F(CApi, ZeroSizeAllocationsHaveUniquePointers) {
  std::set<void*> seen;
  std::vector<void*> ps;
  for (int i = 0; i < 200; ++i) {
    void* p = nullptr;
    ASSERT_EQ(devrt_malloc(&p, 0, host, nullptr), DEVRT_SUCCESS) << last();
    ASSERT_NE(p, nullptr);
    EXPECT_TRUE(seen.insert(p).second) << "pointer " << p << " given twice";
    ps.push_back(p);
  }
  void* real = nullptr;
  ASSERT_EQ(devrt_malloc(&real, 64, host, nullptr), DEVRT_SUCCESS);
  EXPECT_FALSE(seen.contains(real));
  const devrt_stats s = stats();
  EXPECT_EQ(s.live_allocations, 201U);
  EXPECT_EQ(s.in_use_bytes, 64U);
  for (void* p : ps) EXPECT_EQ(devrt_free(p, host, nullptr), DEVRT_SUCCESS) << last();
  EXPECT_EQ(devrt_free(real, host, nullptr), DEVRT_SUCCESS);
  EXPECT_EQ(stats().live_allocations, 0U);
}

// The pointer table under churn: thousands of pointers stay live while hundreds of thousands are
// allocated and freed around them (enough for every shard to forget its oldest frees), and each
// live one is still found, each recent free is still told as a double free.
TEST_F(CApi, LivePointersStayFoundWhileHundredsOfThousandsComeAndGo) {
  std::mt19937_64 rng(7);
  std::vector<void*> kept;
  for (int i = 0; i < 5000; ++i) {
    void* p = nullptr;
    const std::size_t size = 64 + (rng() % 8) * 64;
    ASSERT_EQ(devrt_malloc(&p, size, host, nullptr), DEVRT_SUCCESS) << last();
    kept.push_back(p);
  }
  std::vector<void*> window(64, nullptr);
  for (int i = 0; i < 300000; ++i) {
    void*& slot = window[rng() % window.size()];
    if (slot != nullptr) {
      ASSERT_EQ(devrt_free(slot, host, nullptr), DEVRT_SUCCESS) << last();
    }
    ASSERT_EQ(devrt_malloc(&slot, 64 + (rng() % 16) * 32, host, nullptr), DEVRT_SUCCESS) << last();
  }
  for (void*& p : window) {
    ASSERT_EQ(devrt_free(p, host, nullptr), DEVRT_SUCCESS) << last();
    EXPECT_EQ(devrt_free(p, host, nullptr), DEVRT_ERROR_DOUBLE_FREE) << pointer_text(p);
  }
  std::shuffle(kept.begin(), kept.end(), rng);
  for (void* p : kept) {
    std::size_t size = 0;
    ASSERT_EQ(devrt_allocation_size(p, &size), DEVRT_SUCCESS) << pointer_text(p) << ": " << last();
    EXPECT_GE(size, 64U);
    ASSERT_EQ(devrt_free(p, host, nullptr), DEVRT_SUCCESS) << pointer_text(p) << ": " << last();
  }
  for (void* p : kept) {
    EXPECT_EQ(devrt_free(p, host, nullptr), DEVRT_ERROR_DOUBLE_FREE) << pointer_text(p);
    std::size_t size = 0;
    EXPECT_EQ(devrt_allocation_size(p, &size), DEVRT_ERROR_UNKNOWN_POINTER) << pointer_text(p);
  }
  EXPECT_EQ(stats().live_allocations, 0U);
  expect_allocation_works();
}

TEST_F(CApi, StreamsOnTheHostAreAcceptedAndFreesMayNameAnotherStream) {
  void* const mine = reinterpret_cast<void*>(static_cast<std::uintptr_t>(0x7000));
  void* const other = reinterpret_cast<void*>(static_cast<std::uintptr_t>(0x8000));
  void* p = nullptr;
  ASSERT_EQ(devrt_malloc(&p, 1 << 16, host, mine), DEVRT_SUCCESS) << last();
  std::memset(p, 1, 1 << 16);
  EXPECT_EQ(devrt_record_stream(p, other), DEVRT_SUCCESS) << last();
  EXPECT_EQ(devrt_record_stream(p, DEVRT_STREAM_LEGACY), DEVRT_SUCCESS) << last();
  EXPECT_EQ(devrt_record_stream(p, nullptr), DEVRT_SUCCESS) << last();
  EXPECT_EQ(stats().in_use_bytes, std::uint64_t{1} << 16);         // recording changes nothing on the host
  ASSERT_EQ(devrt_free(p, host, other), DEVRT_SUCCESS) << last();  // not its allocation stream

  void* q = nullptr;
  ASSERT_EQ(devrt_malloc(&q, 100, host, DEVRT_STREAM_LEGACY), DEVRT_SUCCESS) << last();
  ASSERT_EQ(devrt_free(q, host, DEVRT_STREAM_PER_THREAD), DEVRT_SUCCESS) << last();
  const devrt_stats s = stats();
  EXPECT_EQ(s.live_allocations, 0U);
  EXPECT_EQ(s.in_use_bytes, 0U);
  expect_allocation_works();
}

TEST_F(CApi, PyTorchEntryPointsAllocateFreeAndThrowOnFailure) {
  void* p = devrt_torch_malloc(5000, host, nullptr);  // PyTorch's 0: the legacy default stream
  ASSERT_NE(p, nullptr);
  std::memset(p, 3, 5000);
  devrt_torch_record_stream(p, reinterpret_cast<void*>(static_cast<std::uintptr_t>(0x9000)));
  EXPECT_EQ(stats().in_use_bytes, 5000U);
  devrt_torch_free(p, 5000, host, nullptr);
  EXPECT_EQ(stats().in_use_bytes, 0U);

  try {
    (void)devrt_torch_malloc(-5, host, nullptr);
    ADD_FAILURE() << "a negative size was accepted";
  } catch (const std::bad_alloc& e) {
    EXPECT_NE(std::string(e.what()).find("-5"), std::string::npos) << e.what();
  }
  try {
    (void)devrt_torch_malloc(std::int64_t{1} << 61, host, nullptr);
    ADD_FAILURE() << "2^61 bytes were given";
  } catch (const std::bad_alloc& e) {
    EXPECT_NE(std::string(e.what()).find("2305843009213693952"), std::string::npos) << e.what();
    EXPECT_EQ(last(), e.what());
  }
  devrt_torch_empty_cache();  // no CUDA devices: nothing to do
  expect_allocation_works();
}

TEST_F(CApi, TheKeptCopyOfASleepOutlivesTheWakeUntilReleased) {
  ASSERT_EQ(devrt_set_tag("capi.copy"), DEVRT_SUCCESS) << last();
  void* p = nullptr;
  ASSERT_EQ(devrt_malloc(&p, 2u << 20, host, nullptr), DEVRT_SUCCESS) << last();
  ASSERT_EQ(devrt_set_tag(nullptr), DEVRT_SUCCESS);
  std::memset(p, 0x3c, 2u << 20);
  ASSERT_EQ(devrt_sleep(host, "capi.copy", 1), DEVRT_SUCCESS) << last();
  const std::uint64_t kept = stats().offloaded_bytes;
  EXPECT_GE(kept, 2u << 20);
  EXPECT_EQ(stats().host_cached_bytes, 0u);
  ASSERT_EQ(devrt_wake(host, "capi.copy"), DEVRT_SUCCESS) << last();
  EXPECT_EQ(static_cast<unsigned char*>(p)[(2u << 20) - 1], 0x3c);
  EXPECT_EQ(stats().host_cached_bytes, kept);
  std::uint64_t released = 1;
  EXPECT_EQ(devrt_release_host_copies(7, &released), DEVRT_ERROR_INVALID_DEVICE);
  EXPECT_EQ(released, 1u) << "a failed call writes nothing";
  EXPECT_EQ(devrt_release_host_copies(host, &released), DEVRT_SUCCESS) << last();
  EXPECT_EQ(released, kept);
  EXPECT_EQ(stats().host_cached_bytes, 0u);
  EXPECT_EQ(devrt_release_host_copies(host, nullptr), DEVRT_SUCCESS) << "NULL: the count is not wanted";
  EXPECT_EQ(devrt_free(p, host, nullptr), DEVRT_SUCCESS) << last();
}

TEST(CApiStatus, EveryStatusHasAName) {
  for (int s = DEVRT_SUCCESS; s <= DEVRT_ERROR_INTERNAL; ++s) {
    EXPECT_EQ(std::string(devrt_status_name(s)).rfind("DEVRT_", 0), 0U) << s;
    EXPECT_STRNE(devrt_status_name(s), "DEVRT_ERROR_UNKNOWN_STATUS") << s;
  }
  EXPECT_STREQ(devrt_status_name(1000), "DEVRT_ERROR_UNKNOWN_STATUS");
}

}  // namespace

// A limit set below what is live takes effect as the memory is freed: freed memory goes back
// rather than serving new allocations past the limit, whatever the layout.
TEST_F(CApi, ALimitLoweredBelowLiveMemoryHoldsOnceThatMemoryIsFreed) {
  for (const char* layout : {"auto", "sliced:page=16MiB,slice=16MiB", "exclusive-pages"}) {
    ASSERT_EQ(devrt_configure(host, layout), DEVRT_SUCCESS) << layout << ": " << last();
    constexpr std::size_t mib = 1u << 20;
    void* a[6] = {};
    for (void*& p : a) ASSERT_EQ(devrt_malloc(&p, 10 * mib, host, nullptr), DEVRT_SUCCESS) << layout << ": " << last();
    ASSERT_EQ(devrt_set_memory_limit(host, 16 * mib), DEVRT_SUCCESS) << last();
    for (void* p : a) ASSERT_EQ(devrt_free(p, host, nullptr), DEVRT_SUCCESS) << last();
    EXPECT_LE(stats().reserved_bytes, 16 * mib) << layout;
    void* b[6] = {};
    int served = 0;
    for (void*& p : b) {
      const int r = devrt_malloc(&p, 10 * mib, host, nullptr);
      if (r == DEVRT_SUCCESS) {
        ++served;
      } else {
        EXPECT_EQ(r, DEVRT_ERROR_OUT_OF_MEMORY) << layout << ": " << last();
      }
    }
    EXPECT_EQ(served, 1) << layout << ": 10 MiB fits a 16 MiB limit once";
    EXPECT_LE(stats().in_use_bytes, 16 * mib) << layout;
    EXPECT_LE(stats().reserved_bytes, 16 * mib) << layout;
    for (void* p : b) {
      if (p != nullptr) {
        EXPECT_EQ(devrt_free(p, host, nullptr), DEVRT_SUCCESS) << last();
      }
    }
    ASSERT_EQ(devrt_set_memory_limit(host, 0), DEVRT_SUCCESS);
  }
}

TEST_F(CApi, TheMemoryLimitRefusesAllocationsPastItAndZeroLiftsIt) {
  std::uint64_t limit = 1;
  ASSERT_EQ(devrt_get_memory_limit(host, &limit), DEVRT_SUCCESS) << last();
  EXPECT_EQ(limit, 0u) << "no limit by default";
  ASSERT_EQ(devrt_set_memory_limit(host, 48u << 20), DEVRT_SUCCESS) << last();
  ASSERT_EQ(devrt_get_memory_limit(host, &limit), DEVRT_SUCCESS);
  EXPECT_EQ(limit, 48u << 20);
  void* a = nullptr;
  ASSERT_EQ(devrt_malloc(&a, 32u << 20, host, nullptr), DEVRT_SUCCESS) << last();
  const devrt_stats before = stats();
  void* b = nullptr;
  EXPECT_EQ(devrt_malloc(&b, 32u << 20, host, nullptr), DEVRT_ERROR_OUT_OF_MEMORY);
  EXPECT_NE(last().find("memory limit"), std::string::npos) << last();
  EXPECT_EQ(b, nullptr);
  expect_same_memory(before, stats());
  EXPECT_LE(stats().peak_reserved_bytes, 48u << 20);
  EXPECT_EQ(devrt_set_memory_limit(7, 1), DEVRT_ERROR_INVALID_DEVICE);
  EXPECT_EQ(devrt_get_memory_limit(host, nullptr), DEVRT_ERROR_INVALID_VALUE);
  ASSERT_EQ(devrt_set_memory_limit(host, 0), DEVRT_SUCCESS);
  ASSERT_EQ(devrt_malloc(&b, 32u << 20, host, nullptr), DEVRT_SUCCESS) << last();
  EXPECT_EQ(devrt_free(a, host, nullptr), DEVRT_SUCCESS);
  EXPECT_EQ(devrt_free(b, host, nullptr), DEVRT_SUCCESS);
}
