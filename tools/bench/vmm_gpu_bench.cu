// What mapped memory costs the GPU's work, beside memory from cudaMalloc (needs a GPU):
//
// 1. Behind a busy GPU: with a kernel of about 300 ms still running (on a stream of its own or on
//    the legacy stream), how long each virtual memory call of an arena takes on the host
//    (cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease), and cudaMalloc and
//    cudaFree beside them. A call that waited for the GPU would take the kernel's time, and under
//    a framework that runs ahead of the GPU every such call would drain its queue.
// 2. Kernels on mapped memory: a random gather (256 reads per thread over 16 GiB, which misses the
//    GPU's TLBs) and a streaming copy over memory from cudaMalloc and over a range mapped in
//    physical allocations of 2 MiB, 32 MiB, 256 MiB and 1 GiB; best of 5 launches, milliseconds.
//
//     devrt_bench_vmm_gpu [busy|kernels|all]   (default all)
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "vmm_api.hpp"

namespace {

using api = devrt::bench::vmm_api;

void check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "devrt_bench_vmm_gpu: %s failed (%d)\n", what, static_cast<int>(r));
    std::exit(1);
  }
}

void check(cudaError_t r, const char* what) {
  if (r != cudaSuccess) {
    std::fprintf(stderr, "devrt_bench_vmm_gpu: %s failed (%s)\n", what, cudaGetErrorName(r));
    std::exit(1);
  }
}

using clock_type = std::chrono::steady_clock;
double micros(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

__global__ void spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

__global__ void gather(const unsigned* __restrict__ a, size_t n, unsigned* out, unsigned seed, int reads) {
  unsigned x = seed ^ ((blockIdx.x * blockDim.x + threadIdx.x) * 2654435761U);
  unsigned acc = 0;
  for (int i = 0; i < reads; ++i) {
    x = x * 1664525U + 1013904223U;
    acc += a[(static_cast<size_t>(x) * 4099U + static_cast<size_t>(x >> 7) * 65537U) % n];
  }
  if (acc == 0x12345678U) *out = acc;  // keeps the reads
}

__global__ void copy(const float4* a, float4* b, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    b[i] = a[i];
  }
}

CUmemAllocationProp device_prop() {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  return prop;
}

void busy(const api& a) {
  std::printf("behind a busy GPU: microseconds per call on the host (a kernel of about 300 ms queued just before)\n");
  std::printf(
      "| GPU | kernel's stream | MiB | cuMemCreate | cuMemMap | cuMemSetAccess | cuMemUnmap | cuMemRelease | "
      "cudaMalloc | cudaFree |\n|---|---|---|---|---|---|---|---|---|---|\n");
  const CUmemAllocationProp prop = device_prop();
  CUmemAccessDesc desc{};
  desc.location = prop.location;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  int clock_khz = 0;
  check(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0), "cudaDeviceGetAttribute");
  const long long cycles = static_cast<long long>(clock_khz) * 300;  // about 300 ms
  cudaStream_t own = nullptr;
  check(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  for (const std::size_t mib : {2, 32, 256}) {
    const std::size_t bytes = mib << 20;
    for (const bool legacy : {false, true}) {
      for (const bool busy_gpu : {false, true}) {
        CUdeviceptr va = 0;
        check(a.reserve(&va, bytes, 0, 0, 0), "cuMemAddressReserve");
        cudaStream_t s = legacy ? cudaStreamLegacy : own;
        if (busy_gpu) spin<<<1, 1, 0, s>>>(cycles);
        check(cudaGetLastError(), "the kernel's launch");
        CUmemGenericAllocationHandle h = 0;
        const auto t0 = clock_type::now();
        check(a.create(&h, bytes, &prop, 0), "cuMemCreate");
        const auto t1 = clock_type::now();
        check(a.map(va, bytes, 0, h, 0), "cuMemMap");
        const auto t2 = clock_type::now();
        check(a.access(va, bytes, &desc, 1), "cuMemSetAccess");
        const auto t3 = clock_type::now();
        check(a.unmap(va, bytes), "cuMemUnmap");
        const auto t4 = clock_type::now();
        check(a.release(h), "cuMemRelease");
        const auto t5 = clock_type::now();
        void* p = nullptr;
        check(cudaMalloc(&p, bytes), "cudaMalloc");
        const auto t6 = clock_type::now();
        check(cudaFree(p), "cudaFree");
        const auto t7 = clock_type::now();
        check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
        check(a.address_free(va, bytes), "cuMemAddressFree");
        std::printf("| %s | %s | %zu | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f |\n", busy_gpu ? "busy" : "idle",
                    legacy ? "legacy" : "its own", mib, micros(t0, t1), micros(t1, t2), micros(t2, t3), micros(t3, t4),
                    micros(t4, t5), micros(t5, t6), micros(t6, t7));
      }
    }
  }
  check(cudaStreamDestroy(own), "cudaStreamDestroy");
}

float best_of_5(const void* buf, std::size_t bytes, unsigned* out, bool random) {
  cudaEvent_t e0 = nullptr;
  cudaEvent_t e1 = nullptr;
  check(cudaEventCreate(&e0), "cudaEventCreate");
  check(cudaEventCreate(&e1), "cudaEventCreate");
  float best = 1e30F;
  for (unsigned r = 0; r < 5; ++r) {
    check(cudaEventRecord(e0), "cudaEventRecord");
    if (random) {
      gather<<<1320, 256>>>(static_cast<const unsigned*>(buf), bytes / 4, out, r, 256);
    } else {
      const auto* src = static_cast<const float4*>(buf);
      copy<<<1320, 256>>>(src, const_cast<float4*>(src) + bytes / 2 / sizeof(float4), bytes / 2 / sizeof(float4));
    }
    check(cudaGetLastError(), "the kernel's launch");
    check(cudaEventRecord(e1), "cudaEventRecord");
    check(cudaEventSynchronize(e1), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
    if (ms < best) best = ms;
  }
  check(cudaEventDestroy(e0), "cudaEventDestroy");
  check(cudaEventDestroy(e1), "cudaEventDestroy");
  return best;
}

void kernels(const api& a) {
  constexpr std::size_t bytes = std::size_t{16} << 30;
  std::printf(
      "\nkernels over 16 GiB: best of 5 launches, ms (random gather: 256 reads per thread; copy: half to half)\n");
  std::printf("| memory | random gather | copy |\n|---|---|---|\n");
  unsigned* out = nullptr;
  check(cudaMalloc(&out, sizeof(unsigned)), "cudaMalloc");
  const CUmemAllocationProp prop = device_prop();
  CUmemAccessDesc desc{};
  desc.location = prop.location;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  for (int round = 0; round < 2; ++round) {
    void* p = nullptr;
    check(cudaMalloc(&p, bytes), "cudaMalloc (16 GiB)");
    check(cudaMemset(p, 1, bytes), "cudaMemset");
    std::printf("| cudaMalloc | %.2f | %.2f |\n", best_of_5(p, bytes, out, true), best_of_5(p, bytes, out, false));
    check(cudaFree(p), "cudaFree");
    for (const std::size_t chunk :
         {std::size_t{2} << 20, std::size_t{32} << 20, std::size_t{256} << 20, std::size_t{1} << 30}) {
      CUdeviceptr va = 0;
      check(a.reserve(&va, bytes, std::size_t{1} << 30, 0, 0), "cuMemAddressReserve");
      for (std::size_t off = 0; off < bytes; off += chunk) {
        CUmemGenericAllocationHandle h = 0;
        check(a.create(&h, chunk, &prop, 0), "cuMemCreate");
        check(a.map(va + off, chunk, 0, h, 0), "cuMemMap");
        check(a.release(h), "cuMemRelease");  // the mapping keeps the memory
      }
      check(a.access(va, bytes, &desc, 1), "cuMemSetAccess");
      void* q = reinterpret_cast<void*>(va);
      check(cudaMemset(q, 1, bytes), "cudaMemset");
      std::printf("| mapped, %zu MiB allocations | %.2f | %.2f |\n", chunk >> 20, best_of_5(q, bytes, out, true),
                  best_of_5(q, bytes, out, false));
      for (std::size_t off = 0; off < bytes; off += chunk) check(a.unmap(va + off, chunk), "cuMemUnmap");
      check(a.address_free(va, bytes), "cuMemAddressFree");
    }
  }
  check(cudaFree(out), "cudaFree");
}

}  // namespace

int main(int argc, char** argv) {
  const char* what = argc > 1 ? argv[1] : "all";
  if (std::strcmp(what, "busy") != 0 && std::strcmp(what, "kernels") != 0 && std::strcmp(what, "all") != 0) {
    std::fprintf(stderr, "usage: devrt_bench_vmm_gpu [busy|kernels|all]\n");
    return 2;
  }
  if (cudaSetDevice(0) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) {
    std::fprintf(stderr, "devrt_bench_vmm_gpu: no usable CUDA device\n");
    return 1;
  }
  api a;
  if (!a.load()) {
    std::fprintf(stderr, "devrt_bench_vmm_gpu: the driver's virtual memory functions are missing\n");
    return 1;
  }
  if (std::strcmp(what, "kernels") != 0) busy(a);
  if (std::strcmp(what, "busy") != 0) kernels(a);
  return 0;
}
