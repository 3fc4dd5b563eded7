// What a host copy of sleeping memory costs: getting GIB GiB of pinned host memory, copying into
// it, and giving it back, three ways:
//   hostalloc      cudaHostAlloc, cudaFreeHost
//   register-T     mmap, the pages touched by T threads, cudaHostRegister; cudaHostUnregister, munmap
//   reuse          the copy into memory pinned once before (what a cached host copy costs)
// For each: seconds to pin, GB/s of one device-to-host cudaMemcpyAsync of the whole size into it,
// and seconds to free. Needs a GPU and GIB GiB of device and host memory.
//
//     devrt_bench_pinned [GIB]        (default 16)
#include <cuda_runtime_api.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "devrt_bench_pinned: %s failed: %s\n", what, cudaGetErrorName(e));
    std::exit(1);
  }
}

// One device-to-host copy of `bytes` into `host`, waited for: GB/s.
double copy_gbps(void* host, const void* dev, std::size_t bytes, cudaStream_t s) {
  const auto t0 = std::chrono::steady_clock::now();
  check(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  return static_cast<double>(bytes) / seconds_since(t0) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t gib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 16;
  const std::size_t bytes = gib << 30;
  if (cudaSetDevice(0) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) {
    std::fprintf(stderr, "devrt_bench_pinned: no usable CUDA device\n");
    return 1;
  }
  void* dev = nullptr;
  check(cudaMalloc(&dev, bytes), "cudaMalloc");
  check(cudaMemset(dev, 7, bytes), "cudaMemset");
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");

  std::printf("pinned: %zu GiB\nway            pin_s   copy_GBps free_s\n", gib);
  {
    void* p = nullptr;
    auto t0 = std::chrono::steady_clock::now();
    check(cudaHostAlloc(&p, bytes, cudaHostAllocPortable), "cudaHostAlloc");
    const double pin = seconds_since(t0);
    const double gbps = copy_gbps(p, dev, bytes, s);
    const double again = copy_gbps(p, dev, bytes, s);
    t0 = std::chrono::steady_clock::now();
    check(cudaFreeHost(p), "cudaFreeHost");
    std::printf("hostalloc   %8.3f %11.1f %6.3f\n", pin, gbps, seconds_since(t0));
    std::printf("reuse       %8.3f %11.1f %6.3f\n", 0.0, again, 0.0);
  }
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  for (unsigned threads : {1u, 4u, 16u}) {
    if (threads > hw && threads != 1) continue;
    auto t0 = std::chrono::steady_clock::now();
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      std::fprintf(stderr, "devrt_bench_pinned: mmap of %zu GiB failed\n", gib);
      return 1;
    }
    std::vector<std::thread> pool;
    const std::size_t part = (bytes / threads + 4095) & ~std::size_t{4095};
    for (unsigned t = 0; t < threads; ++t) {
      pool.emplace_back([=] {
        auto* b = static_cast<char*>(p);
        const std::size_t lo = std::min(bytes, t * part);
        const std::size_t hi = std::min(bytes, lo + part);
        for (std::size_t i = lo; i < hi; i += 4096) b[i] = 0;
      });
    }
    for (auto& th : pool) th.join();
    const double touch = seconds_since(t0);
    check(cudaHostRegister(p, bytes, cudaHostRegisterPortable), "cudaHostRegister");
    const double pin = seconds_since(t0);
    const double gbps = copy_gbps(p, dev, bytes, s);
    t0 = std::chrono::steady_clock::now();
    check(cudaHostUnregister(p), "cudaHostUnregister");
    munmap(p, bytes);
    std::printf("register-%-2u %8.3f %11.1f %6.3f   (touch %.3f s)\n", threads, pin, gbps, seconds_since(t0), touch);
  }
  check(cudaStreamDestroy(s), "cudaStreamDestroy");
  check(cudaFree(dev), "cudaFree");
  return 0;
}
