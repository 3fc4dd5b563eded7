// The CUDA driver as the storage sees it: the virtual memory management entry points (looked up
// through the runtime, so binaries need no link to libcuda), error conversion, the timing of driver
// calls, and the current-device guard. Internal to devices/.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <memory>

#include "devrt/devices/cuda_storage.hpp"
#include "devrt/memory/error.hpp"

namespace devrt::devices::cuda_detail {

inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
inline cudaEvent_t as_event(void* e) { return static_cast<cudaEvent_t>(e); }

/// A devrt error for a CUDA runtime error (out_of_memory for cudaErrorMemoryAllocation), with the
/// error's name as text. Clears the thread's last error.
error cuda_error(cudaError_t e, const char* what);

/// The driver functions the address ranges use, looked up once per process.
struct driver_api {
  decltype(&cuMemAddressReserve) address_reserve = nullptr;
  decltype(&cuMemAddressFree) address_free = nullptr;
  decltype(&cuMemCreate) create = nullptr;
  decltype(&cuMemRelease) release = nullptr;
  decltype(&cuMemMap) map = nullptr;
  decltype(&cuMemUnmap) unmap = nullptr;
  decltype(&cuMemSetAccess) set_access = nullptr;
  decltype(&cuMemGetAccess) get_access = nullptr;
  decltype(&cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&cuDeviceGetAttribute) attribute = nullptr;
  decltype(&cuGetErrorName) error_name = nullptr;

  /// The process's table; nullptr when the driver lacks one of the functions.
  static std::shared_ptr<const driver_api> load();
  /// A devrt error for a driver error (out_of_memory for CUDA_ERROR_OUT_OF_MEMORY).
  [[nodiscard]] error fail(CUresult r, const char* what) const;
};

/// The allocation properties of physical memory on `device`.
CUmemAllocationProp physical_props(int device);

/// Adds the time of one call to a profile when it goes out of scope.
class timed_call {
 public:
  timed_call(driver_profile& p, driver_profile::kind k) noexcept
      : p_(p), k_(k), start_(std::chrono::steady_clock::now()) {}
  timed_call(const timed_call&) = delete;
  timed_call& operator=(const timed_call&) = delete;
  ~timed_call() {
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_);
    p_.ns[k_] += static_cast<std::uint64_t>(ns.count());
    ++p_.calls[k_];
  }

 private:
  driver_profile& p_;
  driver_profile::kind k_;
  std::chrono::steady_clock::time_point start_;
};

/// Puts the calling thread's current device back as it was when the scope ends.
struct restore_current_device {
  int previous = -1;
  restore_current_device();
  restore_current_device(const restore_current_device&) = delete;
  restore_current_device& operator=(const restore_current_device&) = delete;
  ~restore_current_device();
};

}  // namespace devrt::devices::cuda_detail
