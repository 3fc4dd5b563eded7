// A tour of the memory core on the host device: reserve, bind, write and read, release,
// reconfigure (refused while memory is live, applied once it is free), persistent memory, and
// the usage report.
//
//   devrt_core_tour [--layout LAYOUT] [--count N]
//
// LAYOUT is a preset (sub-slices, exclusive-pages) or a pool list such as
// "sliced:page=1MiB,slice=256KiB;sliced:page=64MiB".
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "devrt/devices/host_storage.hpp"
#include "devrt/memory/memory_manager.hpp"

using namespace devrt;
using namespace devrt::memory;

namespace {

int usage_error(const char* what) {
  std::fprintf(stderr, "devrt_core_tour: %s\nusage: devrt_core_tour [--layout LAYOUT] [--count N]\n", what);
  return 2;
}

// Fills an allocation with a pattern derived from its id, and checks it back.
void fill(const resource& r, std::uint64_t id) {
  auto* p = static_cast<unsigned char*>(r.ptr);
  for (std::uint64_t i = 0; i < r.size; ++i) p[i] = static_cast<unsigned char>((id * 131 + i) & 0xff);
}
bool check(const resource& r, std::uint64_t id) {
  const auto* p = static_cast<const unsigned char*>(r.ptr);
  for (std::uint64_t i = 0; i < r.size; ++i) {
    if (p[i] != static_cast<unsigned char>((id * 131 + i) & 0xff)) return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  memory_layout layout = preset::sub_slices;
  std::uint64_t count = 2000;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--layout" && i + 1 < argc) {
      auto l = parse_layout(argv[++i]);
      if (!l) return usage_error(l.err().message().c_str());
      layout = *l;
    } else if (arg == "--count" && i + 1 < argc) {
      auto n = parse_size(argv[++i]);
      if (!n || *n == 0) return usage_error("--count needs a positive number");
      count = *n;
    } else {
      return usage_error(("unknown argument: " + arg).c_str());
    }
  }

  devices::host_options host;
  host.alignment = 256;
  host.max_page_size = 256ULL << 20;
  auto created = memory_manager::create(storage::make<devices::host_storage>(host),
                                        manager_options{"host", layout, persistent_policy::enabled, std::nullopt});
  if (!created) {
    std::fprintf(stderr, "devrt_core_tour: %s\n", created.err().message().c_str());
    return 1;
  }
  memory_manager& m = **created;
  std::printf("devrt host demo: layout %s, %zu dynamic pools\n", to_string(layout).c_str(), m.dynamic_pool_count());

  // 1. Weights: persistent memory, exact size, kept across reconfiguration.
  m.mode(allocation_mode::persistent);
  std::vector<memory_handle> weights;
  for (int i = 0; i < 4; ++i) weights.push_back(m.reserve(3ULL << 20).value());
  m.mode(allocation_mode::automatic);

  // 2. Activations: reserve, bind to identities made up front (as a pipeline would), fill, check.
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int> pick(0, 99);
  std::vector<memory_handle> live;
  std::uint64_t checked = 0;
  std::uint64_t bytes = 0;
  const auto start = std::chrono::steady_clock::now();
  for (std::uint64_t step = 0; step < count; ++step) {
    const int p = pick(rng);
    const std::uint64_t size = p < 70 ? 256 + rng() % (64 << 10) : p < 95 ? (1 << 20) + rng() % (8 << 20) : 0;
    memory_handle identity = memory_handle::make();
    auto reserved = m.reserve(size);
    if (!reserved) {
      std::fprintf(stderr, "reserve failed: %s\n", reserved.err().message().c_str());
      return 1;
    }
    if (auto b = m.bind(std::move(*reserved), identity); !b) {
      std::fprintf(stderr, "bind failed: %s\n", b.err().message().c_str());
      return 1;
    }
    fill(m.get_resource(identity).value(), identity.id().value);
    bytes += size;
    live.push_back(std::move(identity));
    if (live.size() > 64) {  // release a random older allocation after checking its bytes
      const std::size_t victim = rng() % live.size();
      if (!check(m.get_resource(live[victim]).value(), live[victim].id().value)) {
        std::fprintf(stderr, "data check failed: an allocation was overwritten\n");
        return 1;
      }
      ++checked;
      live[victim] = std::move(live.back());
      live.pop_back();
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%llu allocations (%s requested) in %.3f s; %llu checked intact before release\n",
              static_cast<unsigned long long>(count), format_bytes(bytes).c_str(), secs,
              static_cast<unsigned long long>(checked));
  std::printf("\n-- with %zu activations live --\n%s", live.size(), m.report().c_str());

  // 3. Reconfigure: refused while activations are live, applied once they are released.
  const memory_layout next =
      parse_layout("exclusive:max=0;sliced:page=2MiB,slice=512KiB;sliced:page=32MiB,period=2000;sliced:page=256MiB")
          .value();
  auto refused = m.configure(next).value();
  std::printf("\nconfigure while %s is live: %s\n", format_bytes(refused.live_bytes).c_str(),
              refused.applied ? "applied" : "kept the current layout");
  live.clear();
  auto applied = m.configure(next).value();
  std::printf("configure after releasing the activations: %s\n", applied.applied ? "applied" : "kept");

  // 4. A bad layout is refused with the reason.
  auto bad = parse_layout("sliced:page=1MiB,slice=4MiB").value();
  if (auto r = m.configure(bad); !r) std::printf("configure with a bad layout: %s\n", r.err().message().c_str());

  // 5. The weights survived the new layout.
  for (auto& w : weights) {
    if (!m.get_resource(w)) {
      std::fprintf(stderr, "a persistent allocation was lost by configure\n");
      return 1;
    }
  }
  auto small = m.reserve(100000).value();
  std::printf("\n-- after reconfiguration, weights kept, one new allocation --\n%s", m.report().c_str());
  const std::string problem = m.check_invariants();
  if (!problem.empty()) {
    std::fprintf(stderr, "invariant violated: %s\n", problem.c_str());
    return 1;
  }
  std::printf("\ninvariants hold\n");
  return 0;
}
