// Benchmarks of the device actor on the host device:
//   - round_trip: one thread, reserve through a future and drop; p50 and p99 latency counters;
//   - churn_{reserve,create,mutex}: N threads, each keeping 32 allocations live and replacing one
//     at a time (sizes log-uniform 512 B .. 4 MiB). `reserve` waits for each future, `create` does
//     not wait, `mutex` calls the same memory core directly behind a std::mutex. items/s counts
//     alloc+free pairs over all threads.
//
//   devrt_bench_actor [--benchmark_filter=REGEX] [--benchmark_min_time=SECONDS]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>
#include <random>
#include <vector>

#include "devrt/devices/host_storage.hpp"
#include "devrt/memory/memory_manager.hpp"
#include "devrt/runtime/runtime.hpp"

using namespace devrt;
using devrt::memory::memory_handle;

namespace {

constexpr int live_per_thread = 32;

devices::host_options host_opts() {
  devices::host_options h;
  h.alignment = 512;
  h.max_page_size = 1ULL << 30;
  return h;
}

runtime::runtime& shared_runtime() {
  static runtime::runtime rt([] {
    runtime::runtime_options o;
    o.host = host_opts();
    o.use_environment = false;
    return o;
  }());
  return rt;
}

struct locked_core {
  std::mutex mutex;
  memory::memory_manager manager{memory::storage::make<devices::host_storage>(host_opts()), {}};
};

locked_core& shared_locked_core() {
  static locked_core c;
  return c;
}

std::vector<std::uint64_t> sizes_for(int seed) {
  std::mt19937_64 rng(static_cast<std::uint64_t>(seed) * 7919 + 1);
  std::uniform_real_distribution<double> e(9.0, 22.0);
  std::vector<std::uint64_t> out(4096);
  for (auto& s : out) s = static_cast<std::uint64_t>(std::exp2(e(rng)));
  return out;
}

void round_trip(benchmark::State& state) {
  auto client = shared_runtime().host();
  std::vector<double> ns;
  ns.reserve(1 << 20);
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    auto h = client.reserve(4096).get();
    const auto t1 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(h);
    if (ns.size() < ns.capacity()) ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
  }
  std::sort(ns.begin(), ns.end());
  if (!ns.empty()) {
    state.counters["p50_us"] = ns[ns.size() / 2] / 1000.0;
    state.counters["p99_us"] = ns[std::min(ns.size() - 1, ns.size() * 99 / 100)] / 1000.0;
  }
  state.SetItemsProcessed(state.iterations());
}

void churn_reserve(benchmark::State& state) {
  auto client = shared_runtime().host();
  const auto sizes = sizes_for(state.thread_index());
  std::vector<memory_handle> live(live_per_thread);
  std::size_t i = 0;
  for (auto _ : state) {
    live[i % live_per_thread] = client.reserve(sizes[i % sizes.size()]).get();
    ++i;
  }
  live.clear();
  state.SetItemsProcessed(state.iterations());
}

void churn_create(benchmark::State& state) {
  auto client = shared_runtime().host();
  const auto sizes = sizes_for(state.thread_index());
  std::vector<memory_handle> live(live_per_thread);
  std::size_t i = 0;
  for (auto _ : state) {
    live[i % live_per_thread] = client.create(sizes[i % sizes.size()]);
    ++i;
  }
  live.clear();
  // Include the actor's backlog: wait until everything posted so far has been served.
  (void)client.memory_usage().get();
  state.SetItemsProcessed(state.iterations());
}

void churn_mutex(benchmark::State& state) {
  auto& core = shared_locked_core();
  const auto sizes = sizes_for(state.thread_index());
  std::vector<memory_handle> live(live_per_thread);
  std::size_t i = 0;
  for (auto _ : state) {
    memory_handle h;
    {
      std::lock_guard lock(core.mutex);
      h = core.manager.reserve(sizes[i % sizes.size()]).value();
    }
    live[i % live_per_thread] = std::move(h);
    ++i;
  }
  live.clear();
  state.SetItemsProcessed(state.iterations());
}

}  // namespace

BENCHMARK(round_trip)->UseRealTime();
BENCHMARK(churn_reserve)->ThreadRange(1, 16)->UseRealTime();
BENCHMARK(churn_create)->ThreadRange(1, 16)->UseRealTime();
BENCHMARK(churn_mutex)->ThreadRange(1, 16)->UseRealTime();

BENCHMARK_MAIN();
