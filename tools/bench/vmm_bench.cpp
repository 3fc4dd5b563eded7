// Cost of the CUDA driver's virtual memory calls that arena pools rely on, per call and per unit:
// cuMemCreate, cuMemMap, cuMemSetAccess (per unit, or once over a run of units), cuMemUnmap and
// cuMemRelease, for several unit sizes, with and without a reserved range already holding many
// mappings. Prints one line per measurement; needs a GPU. Then whether the driver serves mappings
// from several threads at once: UNITS mappings (cuMemCreate + cuMemMap + cuMemSetAccess each)
// made by 1, 2, 4 and 8 threads into disjoint parts of one range, wall time per mapping.
//
//     devrt_bench_vmm [UNITS]        (default 512 units per size)
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "vmm_api.hpp"

namespace {

using api = devrt::bench::vmm_api;

double micros_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

void check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "devrt_bench_vmm: %s failed (%d)\n", what, static_cast<int>(r));
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t units = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 512;
  if (cudaSetDevice(0) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) {
    std::fprintf(stderr, "devrt_bench_vmm: no usable CUDA device\n");
    return 1;
  }
  api a;
  if (!a.load()) {
    std::fprintf(stderr, "devrt_bench_vmm: the driver's virtual memory functions are missing\n");
    return 1;
  }
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  CUmemAccessDesc desc{};
  desc.location = prop.location;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;

  std::printf("unit_MiB units  create_us map_us access_unit_us access_run_us unmap_us release_us remap_us\n");
  for (std::size_t mib : {2, 8, 32}) {
    const std::size_t us = mib << 20;
    CUdeviceptr base = 0;
    check(a.reserve(&base, 2 * units * us, us, 0, 0), "cuMemAddressReserve");
    std::vector<CUmemGenericAllocationHandle> h(units);
    auto t0 = std::chrono::steady_clock::now();
    for (auto& x : h) check(a.create(&x, us, &prop, 0), "cuMemCreate");
    const double create = micros_since(t0) / static_cast<double>(units);
    t0 = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < units; ++i) check(a.map(base + i * us, us, 0, h[i], 0), "cuMemMap");
    const double map = micros_since(t0) / static_cast<double>(units);
    // Access per unit on the first half, once over the run on the second half.
    t0 = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < units / 2; ++i) check(a.access(base + i * us, us, &desc, 1), "cuMemSetAccess");
    const double access_unit = micros_since(t0) / static_cast<double>(units / 2);
    t0 = std::chrono::steady_clock::now();
    check(a.access(base + (units / 2) * us, (units - units / 2) * us, &desc, 1), "cuMemSetAccess (run)");
    const double access_run = micros_since(t0) / static_cast<double>(units - units / 2);
    // Move every handle to the second half of the range (a second mapping), then unmap the first.
    t0 = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < units; ++i) check(a.map(base + (units + i) * us, us, 0, h[i], 0), "cuMemMap (remap)");
    check(a.access(base + units * us, units * us, &desc, 1), "cuMemSetAccess (remap)");
    const double remap = micros_since(t0) / static_cast<double>(units);
    t0 = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < units; ++i) check(a.unmap(base + i * us, us), "cuMemUnmap");
    const double unmap = micros_since(t0) / static_cast<double>(units);
    for (std::size_t i = 0; i < units; ++i) check(a.unmap(base + (units + i) * us, us), "cuMemUnmap");
    t0 = std::chrono::steady_clock::now();
    for (auto x : h) check(a.release(x), "cuMemRelease");
    const double release = micros_since(t0) / static_cast<double>(units);
    check(a.address_free(base, 2 * units * us), "cuMemAddressFree");
    std::printf("%8zu %5zu %10.1f %6.1f %14.1f %13.2f %8.1f %10.1f %8.1f\n", mib, units, create, map, access_unit,
                access_run, unmap, release, remap);
  }

  // Mappings from several threads at once, into disjoint parts of one range.
  std::printf("\nthreads unit_MiB mappings wall_us_per_mapping (create + map + access, all threads together)\n");
  for (std::size_t mib : {2, 32}) {
    const std::size_t us = mib << 20;
    CUdeviceptr base = 0;
    check(a.reserve(&base, units * us, us, 0, 0), "cuMemAddressReserve");
    std::vector<CUmemGenericAllocationHandle> h(units);
    for (std::size_t threads : {1, 2, 4, 8}) {
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<std::thread> pool;
      for (std::size_t t = 0; t < threads; ++t) {
        pool.emplace_back([&, t] {
          cudaSetDevice(0);
          for (std::size_t i = t; i < units; i += threads) {
            check(a.create(&h[i], us, &prop, 0), "cuMemCreate");
            check(a.map(base + i * us, us, 0, h[i], 0), "cuMemMap");
            check(a.access(base + i * us, us, &desc, 1), "cuMemSetAccess");
          }
        });
      }
      for (auto& th : pool) th.join();
      const double wall = micros_since(t0) / static_cast<double>(units);
      for (std::size_t i = 0; i < units; ++i) {
        check(a.unmap(base + i * us, us), "cuMemUnmap");
        check(a.release(h[i]), "cuMemRelease");
      }
      std::printf("%7zu %8zu %8zu %19.1f\n", threads, mib, units, wall);
    }
    check(a.address_free(base, units * us), "cuMemAddressFree");
  }
  return 0;
}
