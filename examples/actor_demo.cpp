// Many client threads sharing one device through its memory actor.
//
// Each thread keeps a window of live allocations and replaces one at a time: most are made with
// `create` (no waiting; the actor reserves and binds in order), some with `reserve` and a future
// (timed, for latency percentiles). Every allocation gets a byte pattern written on the device
// strand (`submit`), checked again before it is released. At the end the demo prints throughput,
// reserve latency percentiles, the usage report, and shows a reconfiguration.
//
//   devrt_demo [--threads N] [--ops N] [--layout LAYOUT]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "devrt/runtime/runtime.hpp"

using namespace devrt;
using namespace devrt::runtime;
using memory::memory_handle;

namespace {

struct settings {
  int threads = 16;
  std::uint64_t ops = 20000;  // per thread
  memory::memory_layout layout = memory::preset::sub_slices;
};

int usage_error(const std::string& what) {
  std::fprintf(stderr, "devrt_demo: %s\nusage: devrt_demo [--threads N] [--ops N] [--layout LAYOUT]\n", what.c_str());
  return 2;
}

// The pattern of an allocation: 8-byte words derived from its id.
std::uint64_t word(std::uint64_t id, std::uint64_t i) {
  return (id * 0x9E3779B97F4A7C15ULL) ^ (i * 0xBF58476D1CE4E5B9ULL);
}

void fill(const memory::resource& r, std::uint64_t id) {
  auto* p = static_cast<unsigned char*>(r.ptr);
  for (std::uint64_t i = 0; i + 8 <= r.size; i += 8) {
    const std::uint64_t w = word(id, i);
    std::memcpy(p + i, &w, 8);
  }
}

bool intact(const memory::resource& r, std::uint64_t id) {
  const auto* p = static_cast<const unsigned char*>(r.ptr);
  for (std::uint64_t i = 0; i + 8 <= r.size; i += 8) {
    std::uint64_t w = 0;
    std::memcpy(&w, p + i, 8);
    if (w != word(id, i)) return false;
  }
  return true;
}

struct thread_result {
  std::vector<double> reserve_us;
  std::uint64_t checked = 0;
  std::uint64_t corrupt = 0;
  std::uint64_t errors = 0;
};

// Failed pattern writes, counted by the runtime's completion threads.
std::atomic<std::uint64_t> fill_errors{0};

void worker(const compute_client& client, const settings& s, int index, thread_result& out) {
  std::mt19937_64 rng(static_cast<std::uint64_t>(index) + 1);
  std::uniform_real_distribution<double> log_size(9.0, 16.0);  // 512 B .. 64 KiB
  std::vector<memory_handle> live(32);
  std::vector<std::future<bool>> checks;
  for (std::uint64_t op = 0; op < s.ops; ++op) {
    const auto size = static_cast<std::uint64_t>(std::exp2(log_size(rng)));
    memory_handle& slot = live[op % live.size()];
    if (!slot.empty() && op % 16 == 0) {
      // Check the old allocation's pattern before releasing it (the check holds a binding).
      const auto id = slot.id().value;
      checks.push_back(client.submit({slot.binding()}, [id](submit_context& c) { return intact(c.resources[0], id); }));
    }
    if (op % 10 == 0) {
      const auto t0 = std::chrono::steady_clock::now();
      try {
        slot = client.reserve(size).get();
      } catch (const boost::system::system_error& e) {
        ++out.errors;
        continue;
      }
      out.reserve_us.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    } else {
      slot = client.create(size);
    }
    const auto id = slot.id().value;
    client.submit(
        {slot.binding()}, [id](submit_context& c) { fill(c.resources[0], id); },
        [](error_code ec) {
          if (ec) fill_errors.fetch_add(1, std::memory_order_relaxed);
        });
    if (checks.size() > 64) {
      for (auto& f : checks) (f.get() ? out.checked : out.corrupt) += 1;
      checks.clear();
    }
  }
  for (auto& f : checks) (f.get() ? out.checked : out.corrupt) += 1;
}

double percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

}  // namespace

int main(int argc, char** argv) {
  settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg == "--threads" || arg == "--ops" || arg == "--layout") && i + 1 >= argc) {
      return usage_error(arg + " needs a value");
    }
    if (arg == "--threads") {
      s.threads = std::atoi(argv[++i]);
      if (s.threads <= 0 || s.threads > 1024) return usage_error("--threads must be between 1 and 1024");
    } else if (arg == "--ops") {
      auto n = memory::parse_size(argv[++i]);
      if (!n || *n == 0) return usage_error("--ops must be a positive number");
      s.ops = *n;
    } else if (arg == "--layout") {
      auto l = memory::parse_layout(argv[++i]);
      if (!l) return usage_error(l.err().message());
      s.layout = *l;
    } else {
      return usage_error("unknown argument " + arg);
    }
  }

  runtime_options opts;
  opts.host.alignment = 256;
  opts.host.max_page_size = 256ULL << 20;
  opts.host_layout = s.layout;
  auto rt = runtime::runtime::create(opts);
  if (!rt) {
    std::fprintf(stderr, "devrt_demo: %s\n", rt.err().message().c_str());
    return 1;
  }
  const compute_client client = (*rt)->host();
  std::printf("devrt demo: %d threads x %llu operations on the %s device (layout %s)\n", s.threads,
              static_cast<unsigned long long>(s.ops), client.device().name.c_str(), to_string(s.layout).c_str());

  // Weights in persistent memory, kept across the reconfiguration below.
  std::vector<memory_handle> weights;
  {
    auto scope = client.persistent();
    for (int i = 0; i < 8; ++i) weights.push_back(client.create(2ULL << 20));
  }

  std::vector<thread_result> results(static_cast<std::size_t>(s.threads));
  const auto start = std::chrono::steady_clock::now();
  {
    std::vector<std::thread> threads;
    for (int t = 0; t < s.threads; ++t) {
      threads.emplace_back(worker, std::cref(client), std::cref(s), t, std::ref(results[static_cast<std::size_t>(t)]));
    }
    for (auto& t : threads) t.join();
  }
  (void)client.memory_usage().get();  // every message posted so far has been served
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::vector<double> lat;
  std::uint64_t checked = 0;
  std::uint64_t corrupt = 0;
  std::uint64_t errors = 0;
  for (auto& r : results) {
    lat.insert(lat.end(), r.reserve_us.begin(), r.reserve_us.end());
    checked += r.checked;
    corrupt += r.corrupt;
    errors += r.errors;
  }
  errors += fill_errors.load();
  const double total = static_cast<double>(s.ops) * s.threads;
  std::printf("\n%.0f alloc+free pairs in %.3f s: %.2f M pairs/s (each with a pattern written on the device strand)\n",
              total, secs, total / secs / 1e6);
  std::printf(
      "reserve through a future, queued behind the other threads' messages (%zu samples): p50 %.1f us, "
      "p90 %.1f us, p99 %.1f us, max %.1f us\n",
      lat.size(), percentile(lat, 0.50), percentile(lat, 0.90), percentile(lat, 0.99), percentile(lat, 1.0));
  std::printf("data integrity: %llu allocations checked before release, %llu corrupt; %llu errors\n",
              static_cast<unsigned long long>(checked), static_cast<unsigned long long>(corrupt),
              static_cast<unsigned long long>(errors));
  const auto stats = client.statistics().get();
  std::printf("\n%s", client.report().get().c_str());

  // Reconfigure between "models": refused while memory is live, applied once it is released.
  const auto next = memory::parse_layout("exclusive:max=0;sliced:page=4MiB,slice=1MiB;sliced:page=64MiB").value();
  std::vector<memory_handle> activations;
  for (int i = 0; i < 16; ++i) activations.push_back(client.create(64 << 10));
  const auto kept = client.configure(next).get();
  std::printf("\nconfigure with %s of activations live: %s\n", memory::format_bytes(kept.live_bytes).c_str(),
              kept.applied ? "applied" : "kept the current layout");
  activations.clear();
  const auto applied = client.configure(next).get();
  std::printf("configure after releasing them: %s; %zu weights still resolve: %s\n",
              applied.applied ? "applied" : "kept", weights.size(),
              std::all_of(weights.begin(), weights.end(),
                          [&](const memory_handle& w) { return client.get_resource(w.binding()).get().ptr != nullptr; })
                  ? "yes"
                  : "NO");
  const std::string problem = client.check_invariants().get();
  std::printf("invariants: %s\n", problem.empty() ? "hold" : problem.c_str());
  const bool ok = problem.empty() && corrupt == 0 && errors == 0 && stats.failed_reserves == 0;
  return ok ? 0 : 1;
}
