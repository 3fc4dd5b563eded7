// Benchmarks of the device actor on the host device:
//   - round_trip: one thread, reserve through the default future and drop; p50 and p99 latency
//     counters; round_trip_blocking: the same through Asio's std::future with a device thread
//     that sleeps when idle (idle_spin 0), so that both sides wait in the kernel;
//   - churn_{reserve,create,mutex}: N threads, each keeping 32 allocations live and replacing one
//     at a time (sizes log-uniform 512 B .. 4 MiB). `reserve` waits for each future, `create` does
//     not wait (but every 1024 creates a thread waits for the device to catch up, so the device
//     thread's work is in the time), `mutex` calls the same memory core directly behind a
//     std::mutex. items/s counts alloc+free pairs over all threads.
//
//   [DEVRT_BENCH_LAYOUT=LAYOUT] devrt_bench_actor [--benchmark_filter=REGEX] [--benchmark_min_time=SECONDS]
//
// The host device, with the default layout (an arena) unless DEVRT_BENCH_LAYOUT names another.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>
#include <vector>

#include <boost/asio/use_future.hpp>

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

/// The layout of every benchmark: DEVRT_BENCH_LAYOUT (a layout string), else the default.
memory::memory_layout bench_layout() {
  const char* text = std::getenv("DEVRT_BENCH_LAYOUT");  // NOLINT(concurrency-mt-unsafe): read at start
  if (text == nullptr) return memory::preset::automatic;
  auto l = memory::parse_layout(text);
  if (!l) {
    std::fprintf(stderr, "DEVRT_BENCH_LAYOUT: %s\n", l.err().message().c_str());
    std::exit(2);  // NOLINT(concurrency-mt-unsafe)
  }
  return *l;
}

runtime::runtime_options bench_options(std::chrono::microseconds idle_spin) {
  runtime::runtime_options o;
  o.host = host_opts();
  o.host_layout = bench_layout();
  o.use_environment = false;
  o.idle_spin = idle_spin;
  return o;
}

/// The runtime with the default idle spin.
runtime::runtime& shared_runtime() {
  static runtime::runtime rt(bench_options(runtime::runtime_options{}.idle_spin));
  return rt;
}

struct locked_core {
  std::mutex mutex;
  memory::memory_manager manager{
      memory::storage::make<devices::host_storage>(host_opts()),
      memory::manager_options{"host", bench_layout(), memory::persistent_policy::enabled, std::nullopt}};
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

/// A runtime whose device thread sleeps as soon as it is out of messages.
runtime::runtime& sleeping_runtime() {
  static runtime::runtime rt(bench_options(std::chrono::microseconds(0)));
  return rt;
}

/// One thread: reserve(4096) through a future, then drop. `Spin`: devrt's future and a device
/// thread that polls when idle (the defaults); otherwise Asio's std::future and a device thread that
/// sleeps at once, so both sides wait on the kernel.
template <bool Spin>
void round_trip_impl(benchmark::State& state) {
  auto client = Spin ? shared_runtime().host() : sleeping_runtime().host();
  std::vector<double> ns;
  ns.reserve(1 << 20);
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    memory_handle h;
    if constexpr (Spin) {
      h = client.reserve(4096).get();
    } else {
      h = client.reserve(4096, boost::asio::use_future).get();
    }
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

void round_trip(benchmark::State& state) { round_trip_impl<true>(state); }
void round_trip_blocking(benchmark::State& state) { round_trip_impl<false>(state); }

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
    // The device thread's work is in the time: every 1024 creates, wait until everything this
    // thread posted has been served (the backlog stays bounded).
    if (i % 1024 == 0) (void)client.memory_usage().get();
  }
  live.clear();
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
BENCHMARK(round_trip_blocking)->UseRealTime();
BENCHMARK(churn_reserve)->ThreadRange(1, 16)->UseRealTime();
BENCHMARK(churn_create)->ThreadRange(1, 16)->UseRealTime();
BENCHMARK(churn_mutex)->ThreadRange(1, 16)->UseRealTime();

BENCHMARK_MAIN();
