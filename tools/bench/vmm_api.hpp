// The CUDA driver's virtual memory functions, looked up through the runtime (so that the
// benchmarks link only the static runtime, not libcuda): shared by devrt_bench_vmm and
// devrt_bench_vmm_gpu.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

namespace devrt::bench {

struct vmm_api {
  decltype(&cuMemAddressReserve) reserve = nullptr;
  decltype(&cuMemAddressFree) address_free = nullptr;
  decltype(&cuMemCreate) create = nullptr;
  decltype(&cuMemRelease) release = nullptr;
  decltype(&cuMemMap) map = nullptr;
  decltype(&cuMemUnmap) unmap = nullptr;
  decltype(&cuMemSetAccess) access = nullptr;

  /// Looks every function up; false when the driver lacks one.
  bool load() {
    return entry("cuMemAddressReserve", reserve) && entry("cuMemAddressFree", address_free) &&
           entry("cuMemCreate", create) && entry("cuMemRelease", release) && entry("cuMemMap", map) &&
           entry("cuMemUnmap", unmap) && entry("cuMemSetAccess", access);
  }

 private:
  template <class F>
  static bool entry(const char* name, F& fn) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q) != cudaSuccess || p == nullptr) {
      return false;
    }
    fn = reinterpret_cast<F>(p);
    return true;
  }
};

}  // namespace devrt::bench
