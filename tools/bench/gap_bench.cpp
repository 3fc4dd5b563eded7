// The latency of one allocation and free when the program does other work between them: a loop of
// (busy-wait GAP µs; t0; allocate 1 MiB; free it; t1), percentiles of t1 - t0, for each gap. Real
// programs launch kernels, parse requests or wait on I/O between allocations, so a device thread
// that has gone to sleep meanwhile must not make the next call wait for its wake-up.
//
//   devrt_bench_gap [--api c|cpp] [--device host|cuda] [--gaps 0,5,20,100,1000] [--calls N]
//                   [--size BYTES]
//
// --api c: devrt_malloc + devrt_free through libdevrt_c (device -1 or 0, stream NULL); --api cpp:
// compute_client::reserve(size).get() and the handle's drop. Prints one line per gap: p50, p90,
// p99 and the ratio of p50 to the tight loop's.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

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

}  // namespace

int main(int argc, char** argv) {
  std::string api = "c";
  std::string device = "host";
  std::vector<int> gaps = {0, 5, 20, 100, 1000};
  int calls = 20000;
  std::uint64_t size = 1 << 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
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
  auto pair = [&]() -> bool {
    if (api == "c") {
      void* p = nullptr;
      if (devrt_malloc(&p, size, dev, nullptr) != DEVRT_SUCCESS) return false;
      return devrt_free(p, dev, nullptr) == DEVRT_SUCCESS;
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
  std::printf("devrt_bench_gap: %s interface, %s device, %llu bytes, %d calls per gap\n", api.c_str(), device.c_str(),
              static_cast<unsigned long long>(size), calls);
  std::printf("| gap | p50 | p90 | p99 | p50 / tight p50 |\n|---|---|---|---|---|\n");
  double tight = 0;
  for (const int gap : gaps) {
    const int n = gap >= 1000 ? std::max(1, calls / 10) : calls;
    std::vector<double> lat;
    lat.reserve(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
      busy_wait(std::chrono::microseconds(gap));
      const auto t0 = clock_type::now();
      if (!pair()) return 1;
      lat.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
    }
    const percentiles p = of(lat);
    if (gap == 0 || tight == 0) tight = p.p50;
    std::printf("| %d us | %.2f us | %.2f us | %.2f us | %.2f |\n", gap, p.p50, p.p90, p.p99, p.p50 / tight);
  }
  devrt_shutdown();
  return 0;
}
