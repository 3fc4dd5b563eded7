// The latency of one allocation and free when the program does other work between them: a loop of
// (busy-wait GAP µs; t0; allocate 1 MiB; free it; t1), percentiles of t1 - t0, for each gap. Real
// programs launch kernels, parse requests or wait on I/O between allocations, so a device thread
// that has gone to sleep meanwhile must not make the next call wait for its wake-up.
//
//   devrt_bench_gap [--api c|cpp] [--device host|cuda] [--gaps 0,5,20,100,1000] [--calls N]
//                   [--size BYTES] [--rounds N] [--idle-ms MS] [--check-ratio R] [--check-p99 US]
//                   [--stream null|legacy|device] [--stats]
//
// --api c: devrt_malloc + devrt_free through libdevrt_c (device -1 or 0; stream NULL, CUDA's legacy
// stream, DEVRT_STREAM_LEGACY with --stream legacy, or with --stream device DEVRT_STREAM_DEVICE,
// devrt's own); --stats: the device's statistics afterwards (streams, fences, maps); --api cpp:
// compute_client::reserve(size).get() and the handle's drop; --api none: the machine alone (a lock and
// a small new/delete instead of the pair), to tell the machine's own slow-down after a gap from devrt's. Prints one
// line per gap: p50, p90, p99 and the ratio of p50 to the tight loop's (the first gap's). --rounds N measures every gap
// N times, in turn, and prints the medians over the rounds.
//
// --idle-ms MS: afterwards, the process's CPU time (user + system, every thread) while it sleeps
// MS milliseconds with the device started and idle, as a share of one core.
// --check-ratio R: exit 1 if any gap's p50 is more than R times the tight loop's;
// --check-p99 US: exit 1 if any gap's p99 is more than US microseconds.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <sys/resource.h>

#include "devrt/c_api.h"
#include "devrt/runtime/runtime.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

void busy_wait(std::chrono::microseconds gap) {
  if (gap.count() == 0) return;
  const auto until = clock_type::now() + gap;
  while (clock_type::now() < until) {
  }
}

struct percentiles {
  double p50, p90, p99;
};

percentiles of(std::vector<double>& v) {
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1))]; };
  return percentiles{at(0.50), at(0.90), at(0.99)};
}

std::vector<int> parse_gaps(const char* s) {
  std::vector<int> out;
  for (const char* p = s; *p != 0;) {
    out.push_back(std::atoi(p));
    const char* comma = std::strchr(p, ',');
    if (comma == nullptr) break;
    p = comma + 1;
  }
  return out;
}

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6; };
  return sec(u.ru_utime) + sec(u.ru_stime);
}

}  // namespace

int main(int argc, char** argv) {
  std::string api = "c";
  std::string device = "host";
  std::vector<int> gaps = {0, 5, 20, 100, 1000};
  int calls = 20000;
  std::uint64_t size = 1 << 20;
  int rounds = 1;
  void* c_stream = nullptr;
  int idle_ms = 0;
  double check_ratio = 0;
  double check_p99 = 0;
  bool stats = false;
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--stats") {
      stats = true;
      --i;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n", k.c_str());
      return 2;
    }
    if (k == "--api") {
      api = argv[i + 1];
    } else if (k == "--device") {
      device = argv[i + 1];
    } else if (k == "--gaps") {
      gaps = parse_gaps(argv[i + 1]);
    } else if (k == "--calls") {
      calls = std::atoi(argv[i + 1]);
    } else if (k == "--size") {
      size = std::strtoull(argv[i + 1], nullptr, 10);
    } else if (k == "--stream") {
      const std::string v = argv[i + 1];
      if (v != "null" && v != "legacy" && v != "device") {
        std::fprintf(stderr, "--stream is null, legacy or device\n");
        return 2;
      }
      c_stream = v == "device" ? DEVRT_STREAM_DEVICE : v == "legacy" ? DEVRT_STREAM_LEGACY : nullptr;
    } else if (k == "--rounds") {
      rounds = std::max(1, std::atoi(argv[i + 1]));
    } else if (k == "--idle-ms") {
      idle_ms = std::atoi(argv[i + 1]);
    } else if (k == "--check-ratio") {
      check_ratio = std::atof(argv[i + 1]);
    } else if (k == "--check-p99") {
      check_p99 = std::atof(argv[i + 1]);
    } else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  const int dev = device == "cuda" ? 0 : DEVRT_HOST_DEVICE;
  std::unique_ptr<devrt::runtime::runtime> rt;
  devrt::runtime::compute_client client;
  if (api == "cpp") {
    devrt::runtime::runtime_options o;
    o.use_cuda = device == "cuda";
    rt = std::make_unique<devrt::runtime::runtime>(o);
    client = device == "cuda" ? rt->cuda(0) : rt->host();
  }
  std::mutex control_lock;
  auto pair = [&]() -> bool {
    if (api == "c") {
      void* p = nullptr;
      if (devrt_malloc(&p, size, dev, c_stream) != DEVRT_SUCCESS) return false;
      return devrt_free(p, dev, c_stream) == DEVRT_SUCCESS;
    }
    if (api == "none") {
      // The machine alone: a lock, a small heap allocation and its free, the same gaps.
      const std::lock_guard<std::mutex> g(control_lock);
      auto* q = new std::uint64_t[8]{};
      const bool ok = q[0] == 0;
      delete[] q;
      return ok;
    }
    auto h = client.reserve(size).get();
    return h.ptr() != nullptr;
  };
  for (int i = 0; i < 1000; ++i) {
    if (!pair()) {
      std::fprintf(stderr, "allocation failed: %s\n", api == "c" ? devrt_last_error() : "");
      return 1;
    }
  }
  std::printf("devrt_bench_gap: %s interface, %s device, %llu bytes, %d calls per gap, median of %d round(s)\n",
              api.c_str(), device.c_str(), static_cast<unsigned long long>(size), calls, rounds);
  std::printf("| gap | p50 | p90 | p99 | p50 / tight p50 |\n|---|---|---|---|---|\n");
  // Every round measures every gap in turn; each figure printed is the median over the rounds.
  std::vector<std::vector<percentiles>> measured(gaps.size());
  for (int round = 0; round < rounds; ++round) {
    for (std::size_t g = 0; g < gaps.size(); ++g) {
      const int gap = gaps[g];
      const int n = gap >= 1000 ? std::max(1, calls / 10) : calls;
      std::vector<double> lat;
      lat.reserve(static_cast<std::size_t>(n));
      for (int i = 0; i < n; ++i) {
        busy_wait(std::chrono::microseconds(gap));
        const auto t0 = clock_type::now();
        if (!pair()) return 1;
        lat.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
      }
      measured[g].push_back(of(lat));
    }
  }
  auto median = [](std::vector<percentiles> v, double percentiles::*field) {
    std::sort(v.begin(), v.end(), [&](const percentiles& a, const percentiles& b) { return a.*field < b.*field; });
    return v[v.size() / 2].*field;
  };
  double tight = 0;
  bool failed = false;
  for (std::size_t g = 0; g < gaps.size(); ++g) {
    const int gap = gaps[g];
    const percentiles p{median(measured[g], &percentiles::p50), median(measured[g], &percentiles::p90),
                        median(measured[g], &percentiles::p99)};
    if (g == 0) tight = p.p50;
    std::printf("| %d us | %.2f us | %.2f us | %.2f us | %.2f |\n", gap, p.p50, p.p90, p.p99, p.p50 / tight);
    if (check_ratio > 0 && p.p50 > check_ratio * tight) {
      std::printf("FAIL: at a %d us gap p50 is %.2f times the tight loop's (at most %.2f)\n", gap, p.p50 / tight,
                  check_ratio);
      failed = true;
    }
    if (check_p99 > 0 && p.p99 > check_p99) {
      std::printf("FAIL: at a %d us gap p99 is %.2f us (at most %.2f)\n", gap, p.p99, check_p99);
      failed = true;
    }
  }
  if (idle_ms > 0) {
    const double before = cpu_seconds();
    const auto t0 = clock_type::now();
    std::this_thread::sleep_for(std::chrono::milliseconds(idle_ms));
    const double wall = std::chrono::duration<double>(clock_type::now() - t0).count();
    const double used = cpu_seconds() - before;
    std::printf("idle: %.3f ms of CPU in %.0f ms asleep (%.3f%% of a core)\n", used * 1e3, wall * 1e3,
                100.0 * used / wall);
  }
  if (stats && api == "c") {
    devrt_stats st{};
    if (devrt_get_stats(dev, &st) == DEVRT_SUCCESS) {
      std::printf("stats: %llu allocations, %llu streams, %llu fences, %llu stream waits, %llu maps, %llu unmaps\n",
                  static_cast<unsigned long long>(st.allocations), static_cast<unsigned long long>(st.streams),
                  static_cast<unsigned long long>(st.fences), static_cast<unsigned long long>(st.stream_waits),
                  static_cast<unsigned long long>(st.maps), static_cast<unsigned long long>(st.unmaps));
    }
  }
  devrt_shutdown();
  return failed ? 1 : 0;
}
