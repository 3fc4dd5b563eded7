// The CUDA calls a free on a client's stream costs devrt (needs a GPU): cudaEventRecord from 1,
// 4 and 16 threads at once, each on a stream of its own (a free-time fence is one record per free),
// cudaStreamGetId (a reserve on a stream a client created identifies it), cudaEventQuery, the calls
// that borrow a caller's thread for a request served in place (cudaGetDevice,
// cudaThreadExchangeStreamCaptureMode), and how often cudaStreamCreate hands out the handle of
// the stream destroyed just before.
//
//   devrt_bench_events [CALLS_PER_THREAD]
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

double ns_per(clock_type::time_point t0, int n) {
  return std::chrono::duration<double, std::nano>(clock_type::now() - t0).count() / n;
}

bool check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorName(e));
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 100000;
  if (!check(cudaSetDevice(0), "cudaSetDevice") || !check(cudaFree(nullptr), "cudaFree")) return 1;
  cudaStream_t s = nullptr;
  cudaEvent_t ev = nullptr;
  if (!check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags")) return 1;
  if (!check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreateWithFlags")) return 1;
  auto t0 = clock_type::now();
  for (int i = 0; i < n; ++i) cudaEventRecord(ev, s);
  std::printf("cudaEventRecord, one thread: %.0f ns\n", ns_per(t0, n));
  unsigned long long id = 0;  // NOLINT(google-runtime-int): the runtime's type
  t0 = clock_type::now();
  for (int i = 0; i < n; ++i) cudaStreamGetId(s, &id);
  std::printf("cudaStreamGetId: %.0f ns\n", ns_per(t0, n));
  cudaStreamSynchronize(s);
  t0 = clock_type::now();
  for (int i = 0; i < n; ++i) cudaEventQuery(ev);
  std::printf("cudaEventQuery (passed): %.0f ns\n", ns_per(t0, n));
  // What a request served on the caller's thread costs before and after it (the storage borrows
  // the thread: the device made current, the capture mode set to relaxed, both put back).
  int dev = -1;
  t0 = clock_type::now();
  for (int i = 0; i < n; ++i) cudaGetDevice(&dev);
  std::printf("cudaGetDevice: %.0f ns\n", ns_per(t0, n));
  t0 = clock_type::now();
  for (int i = 0; i < n; ++i) {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    if (mode != cudaStreamCaptureModeRelaxed) cudaThreadExchangeStreamCaptureMode(&mode);
  }
  std::printf("cudaThreadExchangeStreamCaptureMode (to relaxed and back as needed): %.0f ns\n", ns_per(t0, n));
  for (const int threads : {1, 4, 16}) {
    std::vector<std::thread> pool;
    std::atomic<double> sum{0};
    for (int k = 0; k < threads; ++k) {
      pool.emplace_back([&] {
        cudaSetDevice(0);
        cudaStream_t own = nullptr;
        cudaEvent_t e = nullptr;
        cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking);
        cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
        const auto start = clock_type::now();
        for (int i = 0; i < n; ++i) cudaEventRecord(e, own);
        const double ns = ns_per(start, n);
        double cur = sum.load();
        while (!sum.compare_exchange_weak(cur, cur + ns)) {
        }
        cudaStreamSynchronize(own);
        cudaEventDestroy(e);
        cudaStreamDestroy(own);
      });
    }
    for (auto& t : pool) t.join();
    std::printf("cudaEventRecord, %2d threads at once, a stream each: %.0f ns per call\n", threads,
                sum.load() / threads);
  }
  int same = 0;
  cudaStream_t prev = nullptr;
  for (int i = 0; i < 100; ++i) {
    cudaStream_t a = nullptr;
    cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
    same += a == prev ? 1 : 0;
    prev = a;
    cudaStreamDestroy(a);
  }
  std::printf("cudaStreamCreate right after cudaStreamDestroy returned the same handle %d times of 100\n", same);
  cudaEventDestroy(ev);
  cudaStreamDestroy(s);
  return 0;
}
