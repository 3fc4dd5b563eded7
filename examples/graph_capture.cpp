// CUDA graph capture with devrt memory: warm up a small pipeline (so the persistent pool holds
// its scratch memory), capture it, replay the graph many times, verify the result and compare
// the time per step with launching the kernels one by one.
//
//   devrt_graph_capture [--replays N] [--elements N]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "devrt/runtime/runtime.hpp"
#include "graph_kernels.hpp"

using namespace devrt;
using namespace devrt::runtime;
using memory::memory_handle;

namespace {

std::vector<std::byte> as_bytes(const std::vector<float>& v) {
  std::vector<std::byte> out(v.size() * sizeof(float));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int replays = 1000;
  std::uint64_t n = 1 << 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i];
    if (arg == "--replays") {
      replays = std::atoi(argv[i + 1]);
    } else if (arg == "--elements") {
      n = std::strtoull(argv[i + 1], nullptr, 10);
    } else {
      std::fprintf(stderr, "usage: devrt_graph_capture [--replays N] [--elements N]\n");
      return 2;
    }
  }
  if (replays <= 0 || n == 0) {
    std::fprintf(stderr, "devrt_graph_capture: --replays and --elements must be positive\n");
    return 2;
  }
  runtime::runtime rt;
  if (rt.count(device_kind::cuda) == 0) {
    std::printf("devrt_graph_capture: no CUDA device here; nothing to capture\n");
    return 0;
  }
  const compute_client gpu = rt.cuda();
  std::printf("graph capture on %s: %llu elements, %d replays\n", gpu.device().name.c_str(),
              static_cast<unsigned long long>(n), replays);

  // Weights live in persistent memory; inputs and outputs are ordinary allocations.
  memory_handle w;
  memory_handle b;
  {
    auto scope = gpu.persistent();
    w = gpu.create(n * sizeof(float));
    b = gpu.create(n * sizeof(float));
  }
  auto x = gpu.create(n * sizeof(float));
  auto y = gpu.create(n * sizeof(float));
  gpu.write(w.binding(), as_bytes(std::vector<float>(n, 0.5F)));
  gpu.write(b.binding(), as_bytes(std::vector<float>(n, 1.0F)));
  gpu.write(x.binding(), as_bytes(std::vector<float>(n, 2.0F)));
  gpu.write(y.binding(), as_bytes(std::vector<float>(n, 0.0F)));

  // One step: a scratch buffer from the persistent pool, two kernels, the scratch released.
  auto step = [&] {
    memory_handle h;
    {
      auto scope = gpu.persistent();
      h = gpu.create(n * sizeof(float));
    }
    gpu.submit({x.binding(), w.binding(), b.binding(), h.binding(), y.binding()}, [n](submit_context& c) {
      example::pipeline_step(static_cast<const float*>(c.resources[0].ptr),
                             static_cast<const float*>(c.resources[1].ptr),
                             static_cast<const float*>(c.resources[2].ptr), static_cast<float*>(c.resources[3].ptr),
                             static_cast<float*>(c.resources[4].ptr), n, c.stream);
    });
  };

  step();  // warm-up
  gpu.synchronize().get();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < replays; ++i) step();
  gpu.synchronize().get();
  const double eager_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();

  const auto before = gpu.statistics().get();
  gpu.capture_begin().get();
  step();
  device_graph graph = gpu.capture_end().get();
  const auto after = gpu.statistics().get();
  std::printf("captured: %zu persistent slice(s) pinned, driver allocations during capture: %llu\n",
              graph.pins().size(), static_cast<unsigned long long>(after.driver_allocs - before.driver_allocs));

  const auto t1 = std::chrono::steady_clock::now();
  for (int i = 0; i < replays; ++i) gpu.replay(graph, [](error_code) {});
  gpu.synchronize().get();
  const double graph_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t1).count();

  // Every step adds relu(0.5 * 2 + 1) = 2 to y: 1 warm-up + replays eager + replays from the graph.
  const auto out = gpu.read(y.binding()).get();
  std::vector<float> ys(n);
  std::memcpy(ys.data(), out.data(), out.size());
  const float expect = 2.0F * static_cast<float>(1 + 2 * replays);
  std::uint64_t wrong = 0;
  for (float v : ys) wrong += std::fabs(v - expect) > 1e-3F * expect ? 1 : 0;
  std::printf("eager: %.2f us per step; graph replay: %.2f us per step\n", eager_us / replays, graph_us / replays);
  std::printf("result: %s (%llu of %llu elements differ from %.1f)\n", wrong == 0 ? "correct" : "WRONG",
              static_cast<unsigned long long>(wrong), static_cast<unsigned long long>(n), static_cast<double>(expect));
  graph = device_graph();  // waits for the replays, then releases the pins
  std::printf("%s", gpu.report().get().c_str());
  return wrong == 0 && after.driver_allocs == before.driver_allocs ? 0 : 1;
}
