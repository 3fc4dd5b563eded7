// Microbenchmarks of the memory core (no actor, one thread): reserve + drop per preset and
// storage, and a churn of mixed sizes with many allocations live.
//
//   devrt_bench_core [--benchmark_filter=REGEX] [--benchmark_min_time=SECONDS]
#include <benchmark/benchmark.h>

#include <memory>
#include <random>
#include <vector>

#include "devrt/devices/host_storage.hpp"
#include "devrt/devices/sim_storage.hpp"
#include "devrt/memory/memory_manager.hpp"

using namespace devrt;
using namespace devrt::memory;

namespace {

enum class backend { host, sim };

std::unique_ptr<memory_manager> make_manager(backend b, preset p) {
  manager_options opts{"bench", p, persistent_policy::enabled, std::nullopt};
  if (b == backend::host) {
    devices::host_options h;
    h.alignment = 512;
    h.max_page_size = 1ULL << 30;
    return std::make_unique<memory_manager>(storage::make<devices::host_storage>(h), opts);
  }
  devices::sim_options s = devices::sim_options::h200();
  return std::make_unique<memory_manager>(storage::make<devices::sim_storage>(s), opts);
}

// One reserve and one drop of the same size per iteration (the drop is processed by the next
// reserve, as it would be on a device strand).
void reserve_drop(benchmark::State& state, backend b, preset p) {
  auto m = make_manager(b, p);
  const auto size = static_cast<std::uint64_t>(state.range(0));
  for (auto _ : state) {
    auto h = m->reserve(size);
    benchmark::DoNotOptimize(h);
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["reserved_MiB"] = static_cast<double>(m->statistics().bytes_reserved) / (1 << 20);
}

// 256 allocations live; each iteration replaces a random one by a new size drawn log-uniformly
// between 256 B and 16 MiB.
void churn(benchmark::State& state, backend b, preset p) {
  auto m = make_manager(b, p);
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<double> exp2(8.0, 24.0);
  std::vector<std::uint64_t> sizes(1 << 16);
  for (auto& s : sizes) s = static_cast<std::uint64_t>(std::exp2(exp2(rng)));
  std::vector<std::uint32_t> victims(1 << 16);
  for (auto& v : victims) v = static_cast<std::uint32_t>(rng() % 256);
  std::vector<memory_handle> live;
  for (int i = 0; i < 256; ++i) live.push_back(m->reserve(sizes[i]).value());
  std::size_t i = 0;
  for (auto _ : state) {
    const std::size_t k = i & 0xffff;
    live[victims[k]] = m->reserve(sizes[k]).value();
    ++i;
  }
  state.SetItemsProcessed(state.iterations());
  const auto u = m->usage();
  state.counters["live/reserved"] = static_cast<double>(u.bytes_in_use) / static_cast<double>(u.bytes_reserved);
}

void args_sizes(benchmark::internal::Benchmark* bm) { bm->Arg(256)->Arg(64 << 10)->Arg(4 << 20); }

}  // namespace

BENCHMARK_CAPTURE(reserve_drop, host_sub_slices, backend::host, preset::sub_slices)->Apply(args_sizes);
BENCHMARK_CAPTURE(reserve_drop, host_exclusive_pages, backend::host, preset::exclusive_pages)->Apply(args_sizes);
BENCHMARK_CAPTURE(reserve_drop, sim_sub_slices, backend::sim, preset::sub_slices)->Apply(args_sizes);
BENCHMARK_CAPTURE(reserve_drop, sim_exclusive_pages, backend::sim, preset::exclusive_pages)->Apply(args_sizes);
BENCHMARK_CAPTURE(churn, host_sub_slices, backend::host, preset::sub_slices);
BENCHMARK_CAPTURE(churn, host_exclusive_pages, backend::host, preset::exclusive_pages);
BENCHMARK_CAPTURE(churn, sim_sub_slices, backend::sim, preset::sub_slices);
BENCHMARK_CAPTURE(churn, sim_exclusive_pages, backend::sim, preset::exclusive_pages);

BENCHMARK_MAIN();
