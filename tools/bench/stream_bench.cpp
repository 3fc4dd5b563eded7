// Threads with a stream each (needs a GPU): 1, 2, 4, 8 and 16 client threads, each with a
// non-blocking CUDA stream of its own, each keeping 32 allocations live and replacing one at a
// time with a size drawn from a trace (llama_serve by default), for a fixed time per point.
// Measured in one run:
//   - devrt `reserve(size, stream).get()` (the client waits for each handle),
//   - devrt `create(size, stream)` (no wait; every 1024 creates the thread waits for the device to
//     catch up, so the device thread's work is in the time),
//   - cudaMallocAsync / cudaFreeAsync on the thread's stream (the driver's stream-ordered pool).
// Prints a markdown table of alloc+free pairs per second over all threads.
//
//   devrt_bench_streams [--trace PATH] [--seconds S] [--threads 1,2,4,8,16]
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "devrt/devices/cuda_storage.hpp"
#include "devrt/runtime/runtime.hpp"
#include "replay/trace.hpp"

using namespace devrt;
using memory::memory_handle;

namespace {

constexpr int live_per_thread = 32;

std::vector<std::uint64_t> trace_sizes(const std::string& path) {
  std::vector<std::uint64_t> out;
  auto t = replay::read_trace(path);
  if (!t) {
    std::fprintf(stderr, "devrt_bench_streams: %s\n", t.err().message().c_str());
    std::exit(2);  // NOLINT(concurrency-mt-unsafe)
  }
  for (const auto& e : t->events) {
    if (e.kind == replay::event_kind::alloc && e.size > 0) out.push_back(e.size);
  }
  if (out.empty()) out.push_back(4096);
  return out;
}

enum class method { reserve, create, cuda_async };

const char* name_of(method m) {
  switch (m) {
    case method::reserve: return "devrt reserve";
    case method::create: return "devrt create";
    case method::cuda_async: return "cudaMallocAsync";
  }
  return "?";
}

double pairs_per_second(runtime::compute_client gpu, method m, int threads, double seconds,
                        const std::vector<std::uint64_t>& sizes) {
  std::atomic<bool> go{false};
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> pairs{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      cudaSetDevice(0);
      cudaStream_t s = nullptr;
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      const memory::stream st = memory::stream::native(s);
      std::mt19937_64 rng(static_cast<std::uint64_t>(t) * 7919 + 1);
      std::uint64_t n = 0;
      std::vector<memory_handle> live(live_per_thread);
      std::vector<void*> raw(live_per_thread, nullptr);
      auto replace = [&](std::size_t i) {
        const std::uint64_t size = sizes[rng() % sizes.size()];
        switch (m) {
          case method::reserve: live[i] = gpu.reserve(size, st).get(); break;
          case method::create:
            live[i] = gpu.create(size, st);
            if ((n & 1023) == 1023) (void)gpu.memory_usage().get();  // let the device catch up
            break;
          case method::cuda_async:
            if (raw[i] != nullptr) cudaFreeAsync(raw[i], s);
            cudaMallocAsync(&raw[i], size, s);
            break;
        }
      };
      for (std::size_t i = 0; i < live.size(); ++i) replace(i);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      while (!stop.load(std::memory_order_relaxed)) {
        replace(static_cast<std::size_t>(rng() % live_per_thread));
        ++n;
      }
      pairs.fetch_add(n);
      live.clear();
      for (void* p : raw) {
        if (p != nullptr) cudaFreeAsync(p, s);
      }
      cudaStreamSynchronize(s);
      if (m != method::cuda_async) (void)gpu.retire_stream(st).get();
      cudaStreamDestroy(s);
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // streams made, live sets filled
  const auto t0 = std::chrono::steady_clock::now();
  go.store(true, std::memory_order_release);
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop.store(true);
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (auto& th : pool) th.join();
  return static_cast<double>(pairs.load()) / elapsed;
}

}  // namespace

int main(int argc, char** argv) {
  std::string trace = "tools/replay/traces/bert_serve.trace.gz";
  double seconds = 1.0;
  std::vector<int> counts{1, 2, 4, 8, 16};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--trace" && i + 1 < argc) {
      trace = argv[++i];
    } else if (a == "--seconds" && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else if (a == "--threads" && i + 1 < argc) {
      counts.clear();
      std::string list = argv[++i];
      for (std::size_t at = 0; at < list.size();) {
        const std::size_t comma = list.find(',', at);
        counts.push_back(std::atoi(list.substr(at, comma - at).c_str()));
        at = comma == std::string::npos ? list.size() : comma + 1;
      }
    } else {
      std::fprintf(stderr, "usage: devrt_bench_streams [--trace PATH] [--seconds S] [--threads 1,2,4,8,16]\n");
      return 2;
    }
  }
  if (devices::cuda_device_count() == 0) {
    std::fprintf(stderr, "devrt_bench_streams: %s\n", devices::cuda_unavailable_reason().c_str());
    return 2;
  }
  const auto sizes = trace_sizes(trace);
  runtime::runtime_options o;
  o.use_environment = false;
  runtime::runtime rt(o);
  auto gpu = rt.cuda(0);
  std::printf("threads with a stream each, 32 live allocations per thread, sizes from %s, %.1f s per point\n\n",
              trace.c_str(), seconds);
  std::printf("| method |");
  for (int c : counts) std::printf(" %d thr |", c);
  std::printf("\n|---|");
  for (std::size_t i = 0; i < counts.size(); ++i) std::printf("---|");
  std::printf("\n");
  for (method m : {method::reserve, method::create, method::cuda_async}) {
    std::printf("| %s |", name_of(m));
    for (int c : counts) std::printf(" %.2f M/s |", pairs_per_second(gpu, m, c, seconds, sizes) / 1e6);
    std::printf("\n");
    std::fflush(stdout);
  }
  const auto stats = gpu.statistics().get();
  std::printf("\ndevrt: peak reserved %s, %llu fences, %llu waits under memory pressure\n",
              memory::format_bytes(stats.peak_bytes_reserved).c_str(), static_cast<unsigned long long>(stats.fences),
              static_cast<unsigned long long>(stats.stream_waits));
  return 0;
}
